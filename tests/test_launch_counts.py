"""Launches per warm call of the public APIs (issue #26: on a GPU each launch costs ~4-6 us of wall time).

The cases of ``benchmarks/overhead.py`` (the GPU table's tiny problems) run on CPU tensors with every
Triton launch stubbed (as ``overhead.py --part cpu``: the routes a GPU call takes, recorded launches
replayed), on the sm90 arch's registries.  A warm call must build no Problem, make no selection or
plan, go through no Triton binder, and launch exactly the kernels counted here; the torch operations
that would launch kernels of their own on a GPU (a fill for zeros, a layout copy) are checked too.
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the stubbed launches read the interpreter's kernel argument names")

from ck_core import api as core  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import overhead  # noqa: E402

#: case -> Triton launches of one warm call
LAUNCHES = {
    "gemm.matmul 64^3": 1,
    "gemm.matmul 64^3 fwd+bwd": 3,                      # C; dA, dB
    "gemm.linear 64x64 -> 128, bias": 1,                # the bias a stride-0 row of the one GEMM
    "gemm.linear 64x64 -> 128, bias fwd+bwd": 3,        # Y; dX, dW (+ torch's row sum for dbias)
    "fmha.attention S128 D64": 1,
    "fmha.attention S128 D64 fwd+bwd": 4,               # fwd; dot_do_o, dK/dV, dQ pass
    "flash_attn_func S128 D64 causal": 1,
    "flash_attn_func S128 D64 causal fwd+bwd": 4,       # fwd; dot_do_o, dK/dV + atomic dQ, convert
    "flash_attn_varlen_func 2x64 D64": 1,               # fwd (it checks the offsets and poisons itself)
    "flash_attn_varlen_func 2x64 D64 fwd+bwd": 4,       # fwd; dot_do_o, dK/dV + atomic dQ, convert (each checks)
    "fmha.decode.splitkv_decode 4x200 keys": 1,
    "fmha.decode.paged_decode 4x200 keys": 1,           # (CPU tables: the host checks the pages)
    "fmha.decode.appendkv 4x1 new keys": 1,
    "fmha.prefill.batch_prefill 2x32 q, 200 paged keys": 1,   # (CPU tables: the host checks the pages;
                                                              # a GPU adds the page guard: 2)
}


@pytest.fixture(scope="module")
def counts():
    mp = pytest.MonkeyPatch()
    mp.setenv("CK_BACKEND", "triton")
    mp.setenv("CK_CPU_ARCH", "sm90")   # the H200's arch: its registries, plans and launchers
    core.clear()
    try:
        overhead._stub_launches(mp.setattr)
        yield overhead.launch_counts("cpu", list(LAUNCHES))
    finally:
        mp.undo()
        core.clear()


@pytest.mark.parametrize("case", sorted(LAUNCHES))
def test_warm_call_launches_only_its_kernels(counts, case):
    row = counts[case]
    assert "error" not in row, row.get("error")
    assert row["problems"] == 0 and row["selects"] == 0, row
    assert row["jit"] == [], row   # every launch a recorded one
    assert row["launches"] == LAUNCHES[case], row["replayed"]


def test_no_fills_or_layout_copies_on_the_warm_paths(counts):
    # attention's backward: no zeros for the LSE's (absent) gradient
    assert not {"zeros", "zero_", "fill_"} & set(counts["fmha.attention S128 D64 fwd+bwd"]["torch_ops"])
    # flash_attn's non-deterministic backward zeroes its fp32 dQ accumulator, once
    assert counts["flash_attn_func S128 D64 causal fwd+bwd"]["torch_ops"].count("zeros") == 1
    # linear: one allocation forward; backward dW written in the weight's layout (no AccumulateGrad copy)
    assert counts["gemm.linear 64x64 -> 128, bias"]["torch_ops"] == ["empty"]
    ops = counts["gemm.linear 64x64 -> 128, bias fwd+bwd"]["torch_ops"]
    assert "copy_" not in ops and ops.count("sum") == 1, ops


@pytest.mark.parametrize("deterministic", [True, False])
def test_warm_attention_backward_runs_the_plans_keys(monkeypatch, ck_dispatch_log, deterministic):
    """The warm forward and backward report (ck_after_run) exactly the plans' keys that
    ``ck_fmha.api.plan_keys`` names for these tensors: the replayed launches are the plan's."""
    from ck_fmha import attention
    from ck_fmha.api import plan_keys

    monkeypatch.setenv("CK_BACKEND", "triton")
    core.clear()
    overhead._stub_launches(monkeypatch.setattr)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 37, 32, generator=g).half().requires_grad_() for _ in range(3))
    do = torch.randn(1, 2, 37, 32, generator=g).half()
    for _ in range(3):
        for t in (q, k, v):
            t.grad = None
        attention(q, k, v, causal=True, deterministic=deterministic).backward(do)
    ck_dispatch_log.take()
    attention(q, k, v, causal=True, deterministic=deterministic).backward(do)
    runs = ck_dispatch_log.take()
    want = plan_keys(q, k, v, causal=True, deterministic=deterministic)
    assert [r[2] for r in runs] == [tuple(s["kernel"] for s in want["fwd"]),
                                    tuple(s["kernel"] for s in want["bwd"])]
    core.clear()
