"""Ahead-of-time builds of GEMM registries for all six arch targets, through the core.

A small registry per arch (the smallest, a middle and the largest shared-memory
kernel the arch's prune lets through, plus the tuned ones where they exist) is
built by ``Registry.build`` on the triton backend into a fresh cache: every
kernel must compile to the arch's code object (hsaco / cubin), its reported
shared memory must fit the arch and stay within the template's own model (the
model is what prunes the kernel space), and a second build is all cache hits.
Runs in a subprocess: the test session uses Triton's interpreter.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from ck_core import Registry, get_manager
    from ck_core.build import build_registry
    from ck_gemm.backends.triton.configs import smem_bytes
    from ck_gemm.backends.triton.keys import config_of
    cache = sys.argv[1]
    out = {}
    for arch in sorted(get_manager().archs()):
        spec = get_manager().arch(arch)
        full = Registry.from_enumeration("gemm", arch, "triton", dtypes=["fp16"], layouts=["rcr"])
        keys = sorted(full, key=lambda k: (smem_bytes(config_of(k), "fp16"), k.name))
        pick = [keys[0], keys[len(keys) // 2], keys[-1]]
        reg = Registry(arch, pick)
        # a Triton cache per arch: the pool's workers (forked from a server started with
        # the first arch's environment) must follow the change
        tdir = os.path.join(cache, "triton_" + arch)
        os.environ["TRITON_CACHE_DIR"] = tdir
        rep = build_registry(reg, max_workers=2, progress=False, cache_root=cache)
        again = build_registry(Registry(arch, pick), max_workers=1, progress=False, cache_root=cache)
        out[arch] = {"lds": spec.lds_bytes, "vendor": spec.vendor, "failed": rep.failed,
                     "triton_files": sum(len(f) for _, _, f in os.walk(tdir)),
                     "hits": again.cache_hits, "n": len(pick),
                     "built": {k.name: dict(rep.built.get(k.name, {}),
                                            model=smem_bytes(config_of(k), "fp16")) for k in pick}}
    print("RESULT" + json.dumps(out))
''')


@pytest.mark.slow   # (about a minute: CI compiles the sm90 GEMM kernels in test_triton_kernels.py)
def test_every_arch_builds_ahead_of_time(tmp_path):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT")][-1][6:])
    assert {"gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201", "sm90"} <= set(res)
    for arch, info in res.items():
        assert not info["failed"], (arch, info["failed"])
        assert info["hits"] == info["n"], f"{arch}: second build was not served from the cache"
        assert info["triton_files"] > 0, f"{arch}: the workers ignored the caller's TRITON_CACHE_DIR"
        for name, meta in info["built"].items():
            assert meta["binary"] == ("cubin" if info["vendor"] == "nvidia" else "hsaco"), name
            assert 0 < meta["shared"] <= info["lds"], (name, meta["shared"], info["lds"])
            assert meta["shared"] <= meta["model"], (name, meta["shared"], meta["model"])
