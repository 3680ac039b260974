"""Built is what runs: the launchers' kernels come from the entries ``ck build`` writes.

Compiles for sm90 on this CPU-only machine (triton.compile needs no GPU); the
launcher's arguments are real (``ck_gemm.backends.triton.gemm`` on meta tensors), only the
final launch is left out.  Runs in subprocesses: the test session uses Triton's
interpreter, and "a fresh process finds a warm cache" needs fresh processes.
"""
import os
import textwrap

import pytest

from ck_core.testing import run_compiled

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from ck_core import Registry
    from ck_core.backends import triton_artifacts as ta
    from ck_core.build import build_registry
    from ck_core.cache import KernelCache
    from ck_gemm.backends.triton import launch as L
    from ck_gemm.backends.triton.keys import config_of

    mode, cache, out = sys.argv[1], sys.argv[2], {}
    ta.current_target = lambda: GPUTarget("cuda", 90, 32)   # the GPU this box does not have
    full = Registry.from_enumeration("gemm", "sm90", "triton", dtypes=["fp16"], layouts=["rcr"])
    key = min((k for k in full if config_of(k).variant == "plain" and config_of(k).split_k == 1),
              key=lambda k: (config_of(k).block_m * config_of(k).block_n, k.name))

    def launcher_call(m, n, k, name=key.name):
        """The kernel the GEMM launcher would launch for an (m, n, k) rcr problem."""
        got = []

        def capture(spec, vals, M, N, batch, kname):
            fn, args, kwargs = L.call_of(spec, vals)
            got.append(ta.kernel_for_call(kname, fn, args, kwargs, cache_root=cache)[0])
        a = torch.empty((m, k), dtype=torch.float16, device="meta")
        b = torch.empty((n, k), dtype=torch.float16, device="meta")
        L.gemm(a, b, layout="rcr", config=config_of(key), num_sms=132, kernel_name=name, launch=capture)
        return got[0]

    def no_compiler(*a, **k):
        raise AssertionError("compiled although the cache holds the kernel")

    if mode == "build":
        rep = build_registry(Registry("sm90", [key]), max_workers=1, progress=False, cache_root=cache)
        out["failed"] = rep.failed
    elif mode == "warm":
        triton.compile = no_compiler
        bk = config_of(key).block_k
        ck = launcher_call(3 * 128, 5 * 64, 4 * bk)    # another aligned problem than ck build's
        out["stats"] = dict(ta.STATS)
        out["name"] = ck.metadata.name
        # sizes are run-time integers, M, N, K only their alignment class: other sizes (a unit M,
        # odd token counts, a K that is not a whole K tile) load the kernels ck build compiled
        sizes = [(1, 5 * 64, 4 * bk), (1001, 64, 2 * bk), (48, 7 * 64, 4 * bk + 16), (7, 16, 8 * bk + 16)]
        out["names"] = sorted({launcher_call(*mnk).metadata.name for mnk in sizes})
        out["sizes"] = dict(ta.STATS)
    elif mode == "cold":
        ck = launcher_call(100, 60, 100)                  # unaligned: its own specialisation
        first = dict(ta.STATS)
        ta.forget()
        launcher_call(100, 60, 100)
        again = dict(ta.STATS)
        launcher_call(96, 64, 96)                          # aligned: not the unaligned kernel
        out["stats"] = [first, again, dict(ta.STATS)]
    elif mode == "tamper":
        name = "tamper"
        ck = launcher_call(100, 60, 100, name)
        cache_ = KernelCache(cache)
        entries = [p for p in cache_._entries() if json.loads(p.with_suffix(".json").read_text())["kernel"] == name]
        assert len(entries) == 1, entries
        bin_path = entries[0]
        rec_path = bin_path.with_suffix(".json")
        results = []
        import hashlib
        import struct

        def rewrite_head(blob, edit):   # Triton's metadata in the blob, edited; the record made consistent
            n = struct.unpack_from("<Q", blob, len(ta._MAGIC))[0]
            start = len(ta._MAGIC) + 8
            head = json.loads(blob[start:start + n])
            edit(head)
            h = json.dumps(head).encode()
            return ta._MAGIC + struct.pack("<Q", len(h)) + h + blob[start + n:]

        def other_entry():   # the same kernel's entry of another specialisation (aligned sizes)
            launcher_call(96, 64, 96, name)
            others = [p for p in cache_._entries() if p != bin_path
                      and json.loads(p.with_suffix(".json").read_text())["kernel"] == name]
            return others[0]

        for damage in ("flip", "forged", "no_num_warps", "unknown_target", "copied"):
            blob = bin_path.read_bytes()
            if damage == "flip":           # the record's hash no longer matches
                blob = blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:])
                bin_path.write_bytes(blob)
            elif damage == "copied":       # another specialisation's entry copied over this one's
                src = other_entry()
                bin_path.write_bytes(src.read_bytes())
                rec_path.write_bytes(src.with_suffix(".json").read_bytes())
            else:                          # a consistent record over a blob the cache did not write
                if damage == "forged":
                    blob = b"#!/bin/sh\\necho pwned\\n"
                elif damage == "no_num_warps":
                    blob = rewrite_head(blob, lambda h: h.pop("num_warps"))
                else:
                    blob = rewrite_head(blob, lambda h: h.update(target=dict(h["target"], backend="nosuchgpu")))
                bin_path.write_bytes(blob)
                rec = json.loads(rec_path.read_text())
                rec["sha256"] = hashlib.sha256(blob).hexdigest()
                rec_path.write_text(json.dumps(rec))
            ta.forget()
            before = ta.STATS["compiled"]
            launcher_call(100, 60, 100, name)
            results.append(ta.STATS["compiled"] - before)
            ok = ta.unpack(bin_path.read_bytes(), None)        # the entry is whole again
            results.append(len(ok.kernel) > 0)
        out["results"] = results
    print("RESULT" + json.dumps(out))
''')


def _run(mode, cache):
    return run_compiled(["-c", SCRIPT, mode, str(cache / "kernels")], env={"TRITON_CACHE_DIR": str(cache / "triton")},
                        timeout=600)


def test_launcher_loads_what_ck_build_compiled(tmp_path):
    assert _run("build", tmp_path) == {"failed": {}}
    warm = _run("warm", tmp_path)   # a fresh process; triton.compile raises in it
    assert warm["stats"] == {"compiled": 0, "loaded": 1, "memory": 0}
    assert warm["name"] == "gemm_plain_kernel"
    assert warm["sizes"]["compiled"] == 0, warm["sizes"]
    assert warm["sizes"]["loaded"] <= 4 and warm["names"] == ["gemm_plain_kernel"]   # M class x EVEN_K


def test_missing_artifact_is_built_once_then_reused(tmp_path):
    first, again, aligned = _run("cold", tmp_path)["stats"]
    assert first == {"compiled": 1, "loaded": 0, "memory": 0}
    assert again == {"compiled": 1, "loaded": 1, "memory": 0}     # from the cache, not compiled again
    assert aligned["compiled"] == 2, "an aligned problem must not run the unaligned kernel, nor the reverse"
    warm = _run("cold", tmp_path)["stats"][0]                       # and a fresh process loads it
    assert warm == {"compiled": 0, "loaded": 1, "memory": 0}


def test_tampered_artifact_is_rejected_and_rebuilt(tmp_path):
    """Damage of every kind (torn binary; a forged blob; Triton metadata without num_warps or for an
    unknown target, with a consistent record; another specialisation's entry copied over this one)
    is an absent entry: rebuilt once, never raised, never loaded as this kernel."""
    res = _run("tamper", tmp_path)["results"]
    built, ok = res[0::2], res[1::2]
    assert built == [1, 1, 1, 1, 1], "a damaged or foreign entry must be rebuilt, not loaded"
    assert all(ok)


def test_public_apis_launch_under_their_key_names(ck_dispatch_log, monkeypatch):
    """The cache entry a launch looks for is named after the key the Dispatcher chose
    (what ``ck build`` names its entries), for GEMM and conv; a second kernel of a key
    (conv: ``<key>/<function>``) adds a suffix."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ck_gemm")
    pytest.importorskip("ck_conv")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors run triton kernels only in the interpreter")
    from ck_conv import conv2d
    from ck_gemm import matmul

    from ck_core.backends import triton_artifacts as ta

    monkeypatch.setenv("CK_BACKEND", "triton")
    names, real = [], ta.launch

    def spy(name, fn, grid, args, kwargs, **kw):
        names.append(name)
        return real(name, fn, grid, args, kwargs, **kw)

    monkeypatch.setattr(ta, "launch", spy)
    a, b = torch.randn(9, 5), torch.randn(5, 7)
    x, w = torch.randn(1, 3, 6, 5), torch.randn(4, 3, 3, 3)
    assert float((matmul(a, b) - a @ b).abs().max()) < 1e-4
    want = torch.nn.functional.conv2d(x, w, padding=1)
    assert float((conv2d(x, w, padding=1) - want).abs().max()) < 1e-4
    (gemm_key,), (conv_key,) = (r[2] for r in ck_dispatch_log.take())
    assert names[0] == gemm_key
    assert names[1:] and all(n.startswith(conv_key + "/conv_") for n in names[1:]), names
