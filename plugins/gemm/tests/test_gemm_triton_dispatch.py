"""GEMM through the dispatcher on the triton backend, run by Triton's CPU interpreter.

The interpreter must be switched on before the kernels are defined, so the
check runs in a fresh interpreter process (the AOT tests in this session need
real JIT functions).  bf16 is left to the GPU tests: Triton 3.6's interpreter
returns garbage for a bf16 ``tl.dot`` even in a 16x16 one-liner kernel.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import attrs
    import numpy as np
    from ck_core import PluginManager, Registry, Dispatcher, plugins
    from ck_core.testing import arch_plugin, make_fake_arch, check_against_reference
    from ck_gemm import GemmProblem
    arch = make_fake_arch()
    plugins.reset_manager(PluginManager(plugins=[arch_plugin(arch)]))
    rng = np.random.default_rng(int(sys.argv[1]))
    out = []
    cases = [("fp16", "rcr", {}, 1), ("fp32", "rrr", {}, 1), ("fp16", "crr", {}, 1),
             ("fp16", "ccr", {}, 1), ("fp16", "rcr", dict(num_d=1, d_op="add", activation="relu"), 1),
             ("fp16", "rcr", dict(num_d=2, d_op="mul", activation="sigmoid"), 1),
             ("fp16", "rcr", {}, 3)]
    for dtype, layout, epi, split in cases:
        base = Registry.from_enumeration("gemm", arch.name, "triton", dtypes=[dtype], layouts=[layout])
        base = base.filter("c.tile_m == 64 and c.tile_n == 64 and c.pad_m and c.pipeline == 'mem'")
        reg = Registry(arch.name, [attrs.evolve(k, signature=attrs.evolve(k.signature, **epi),
                                                algorithm=attrs.evolve(k.algorithm, split_k=split))
                                   for k in base])
        m, n, k = (int(x) * 2 + 1 for x in rng.integers(10, 40, size=3))
        p = GemmProblem(m=m, n=n, k=k, batch=1 + int(split == 1 and layout == "rcr" and not epi),
                        dtype=dtype, layout=layout, **epi)
        d = Dispatcher(reg, backend="triton")
        rep = check_against_reference(d, p, rng)
        out.append({"case": f"{dtype} {layout} {epi} sk{split} {m}x{n}x{k}", "passed": rep.passed,
                    "detail": str(rep), "kernel": d.select(p).name})
    print(json.dumps(out))
''')


def test_dispatched_triton_gemm_under_interpreter(ck_rng):
    env = dict(os.environ, TRITON_INTERPRET="1")
    seed = str(int(ck_rng.integers(1 << 30)))
    r = subprocess.run([sys.executable, "-c", SCRIPT, seed], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == 7
    bad = [row for row in rows if not row["passed"]]
    assert not bad, bad
    assert any("_sk3" in row["kernel"] for row in rows)


STREAMK_SCRIPT = textwrap.dedent('''
    import json, sys
    import attrs
    import numpy as np
    from ck_core import Registry, Dispatcher
    from ck_core.testing import check_against_reference
    from ck_gemm import GemmProblem
    rng = np.random.default_rng(int(sys.argv[1]))
    out = []
    # odd sizes take the pointer kernel, 16-byte aligned rows the descriptor one; tiles shared by
    # several programs (K steps split) in both
    for variant, (m, n, k), layout in (("streamk", (67, 45, 331), "rcr"), ("streamk", (131, 70, 97), "crr"),
                                       ("tma_streamk", (72, 56, 400), "rcr"), ("tma_streamk", (130, 64, 136), "rrr")):
        # the sm90 keys of 64x64 tiles as stream-K keys (the arch does not enumerate stream-K for now)
        base = Registry.from_enumeration("gemm", "sm90", "triton", dtypes=["fp16"], layouts=[layout])
        base = base.filter("c.variant == 'tma' and c.split_k == 1 and c.tile_m == 64 and c.tile_n == 64")
        reg = Registry("sm90", [attrs.evolve(k, algorithm=attrs.evolve(k.algorithm, variant=variant))
                                for k in base])
        p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout=layout)
        d = Dispatcher(reg, backend="triton")
        rep = check_against_reference(d, p, rng)
        out.append({"case": f"{variant} {layout} {m}x{n}x{k}", "passed": rep.passed, "detail": str(rep),
                    "kernel": d.select(p).name})
    print(json.dumps(out))
''')


def test_dispatched_streamk_under_interpreter(ck_rng):
    env = dict(os.environ, TRITON_INTERPRET="1")
    seed = str(int(ck_rng.integers(1 << 30)))
    r = subprocess.run([sys.executable, "-c", STREAMK_SCRIPT, seed], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == 4 and all("stk" in row["kernel"] for row in rows), rows
    bad = [row for row in rows if not row["passed"]]
    assert not bad, bad
