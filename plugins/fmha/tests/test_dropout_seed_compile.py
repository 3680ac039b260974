"""The dropout seed is data, not a shape: every seed compiles, and to one kernel.

Triton makes an int argument equal to 1 a compile-time constant (and specialises others on
divisibility by 16).  A seed word of 1 then reached ``.to(tl.uint32, bitcast=True)`` as a Python
int and the forward did not compile (examples/fmha/21_stress_test.py on the H100, seed=1).  As
tests/test_fmha_built.py: compiled for sm90 on this CPU-only machine in a subprocess, the launcher
run on meta tensors up to the launch itself.
"""
import textwrap

import pytest

from ck_core.testing import run_compiled

pytest.importorskip("triton")
pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    from triton.backends.compiler import GPUTarget
    from ck_core import Registry
    from ck_core.backends import triton_artifacts as ta
    from ck_fmha.backends.triton import implement as TI
    from ck_fmha.problem import FmhaProblem

    cache = sys.argv[1]
    ta.current_target = lambda: GPUTarget("cuda", 90, 32)   # the GPU this box does not have
    key = min((k for k in Registry.from_enumeration("fmha", "sm90", "triton")
               if k.signature.family == "fwd" and k.signature.dtype == "fp16" and k.signature.hdim_q == 64
               and k.algorithm.variant == "ptr"),
              key=lambda k: (k.algorithm.block_m * k.algorithm.block_n, k.name))
    ta.launch = lambda name, fn, grid, args, kwargs, cache_root=None, extra=None: ta.kernel_for_call(
        name, fn, args, kwargs, cache_root=cache, extra=extra)
    meta = lambda *shape: torch.empty(shape, dtype=torch.float16, device="meta")
    out = {"key": key.name, "errors": {}}
    for seed in (1, 2, 16, (1 << 32) + 1):     # words 1, 2, 16 and (lo 1, hi 1)
        p = FmhaProblem(batch=2, nhead_q=4, seqlen_q=96, seqlen_k=80, hdim_q=64, dtype="fp16", p_drop=0.2,
                        seed=seed, offset=1)
        try:
            TI.make_launcher(key)(p, dict(q=meta(2, 4, 96, 64), k=meta(2, 4, 80, 64), v=meta(2, 4, 80, 64)))
        except Exception as e:
            out["errors"][seed] = f"{type(e).__name__}: {e}"[-600:]
    out["stats"] = dict(ta.STATS)
    print("RESULT" + json.dumps(out))
''')


def test_every_dropout_seed_compiles_to_one_kernel(tmp_path):
    out = run_compiled(["-c", SCRIPT, tmp_path / "kernels"], env={"TRITON_CACHE_DIR": str(tmp_path / "triton")})
    assert out["errors"] == {}, out
    assert out["stats"]["compiled"] == 1, out     # one kernel for every seed and offset
