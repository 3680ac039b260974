"""FMHA problems too large for memory are refused before anything is allocated (issue 12), and
the numpy backend's check counts its float64 working copies, not just the tensors."""
from __future__ import annotations

import time

import numpy as np
import pytest

from ck_core import Dispatcher, PluginManager, Registry, memory, plugins
from ck_core.errors import UnsupportedProblem
from ck_core.testing import arch_plugin, make_fake_arch
from ck_fmha import footprint
from ck_fmha.problem import FmhaProblem
from ck_fmha.plan import make_inputs, run_stage

GIB = 1 << 30


@pytest.fixture(scope="module")
def disp():
    old = plugins._MANAGER
    plugins.reset_manager(PluginManager(plugins=[arch_plugin(make_fake_arch())]))
    out = {b: Dispatcher(Registry.from_enumeration("fmha", "fake64", b, dtypes="fp16"), backend=b)
           for b in ("numpy", "triton")}
    yield out
    plugins.reset_manager(old)


@pytest.fixture
def host_gib(monkeypatch):
    """Pretend the host has 4 GiB available."""
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 4 * GIB)


@pytest.mark.parametrize("kw", [
    dict(family="fwd", batch=64, nhead_q=32, seqlen_q=65536, seqlen_k=65536, hdim_q=128),
    dict(family="bwd_dq_dk_dv", batch=16, nhead_q=32, seqlen_q=65536, seqlen_k=65536, hdim_q=128),
    dict(family="fwd_splitkv", batch=8, nhead_q=32, seqlen_q=1024, seqlen_k=1 << 20, num_splits=8),
    dict(family="fwd_pagedkv", batch=64, nhead_q=8, seqlen_q=1, seqlen_k=1 << 22, paged_kv=True, page_size=64,
         seqlens_k=(1 << 22,) * 64),
])
def test_impossible_problem_is_refused_before_allocation(disp, host_gib, kw):
    p = FmhaProblem(**kw)
    assert footprint.bytes_moved(p) > 4 * GIB
    for backend in ("numpy", "triton"):   # the triton dispatcher here runs on the CPU: host memory
        t0 = time.monotonic()
        with pytest.raises(UnsupportedProblem, match=r"GiB.*available host memory"):
            disp[backend].plan(p)
        assert time.monotonic() - t0 < 5


def test_numpy_check_counts_float64_working_copies(disp, host_gib):
    """Tensors of ~0.1 GiB, but the numpy reference holds float64 score matrices of
    nhead * seqlen_q * seqlen_k per sequence (~8 GiB each): refused on numpy, not for the tensors."""
    p = FmhaProblem(family="fwd", batch=1, nhead_q=16, seqlen_q=8192, seqlen_k=8192, hdim_q=64)
    assert footprint.bytes_moved(p) < 0.2 * GIB
    assert footprint.working_bytes(p, "numpy") > 4 * GIB
    assert footprint.working_bytes(p, "triton") == 0
    with pytest.raises(UnsupportedProblem, match="working copies"):
        disp["numpy"].plan(p)
    disp["triton"].plan(p)   # the kernels need only the tensors


@pytest.mark.parametrize("kw", [
    dict(family="fwd", batch=2, nhead_q=4, nhead_k=2, seqlen_q=5, seqlen_k=7, hdim_q=16, hdim_v=32),
    dict(family="fwd", batch=2, nhead_q=2, seqlen_q=5, seqlen_k=7, layout="bshd", bias="elementwise",
         p_drop=0.2, store_randval=True),
    dict(family="fwd_splitkv", batch=2, nhead_q=2, seqlen_q=3, seqlen_k=9, num_splits=3),
    dict(family="bwd_dq_dk_dv", batch=1, nhead_q=2, seqlen_q=6, seqlen_k=5, hdim_q=16),
    dict(family="fwd", mode="group", batch=2, nhead_q=2, seqstart_q=(0, 3, 8), seqstart_k=(0, 4, 6)),
    dict(family="fwd_appendkv", batch=2, nhead_q=2, seqlen_knew=3, seqlens_k=(4, 6), seqlen_k=12,
         rope="interleaved", rotary_dim=16),
])
def test_bytes_moved_counts_the_plan_tensors(kw):
    """Independently: the bytes of the inputs make_inputs draws plus the outputs every stage of the
    plan writes (dtype sizes of the kernels' storage: fp16 data, fp32 statistics; an append-KV's
    caches are updated in place, its q_rot is new; its small rotary tables are left out)."""
    p = FmhaProblem(**kw)
    t = make_inputs(p, np.random.default_rng(0))
    bytes_of = {"q": 2, "k": 2, "v": 2, "o": 2, "do": 2, "bias": 2, "lse": 4, "o_acc": 4, "lse_acc": 4,
                "d": 4, "dq_acc": 4, "dq": 2, "dk": 2, "dv": 2, "randval": 1, "q_rot": 2, "knew": 2,
                "vnew": 2, "k_cache": 2, "v_cache": 2}
    from ck_fmha.plan import plan
    for _, sub in plan(p):
        t.update(run_stage(sub, t))
    want = sum(np.asarray(x).size * bytes_of[n] for n, x in t.items() if n in bytes_of)
    assert footprint.bytes_moved(p) == want


def test_deterministic_backward_tensors_do_not_grow_with_key_blocks(disp):
    """The GPU plans' deterministic backward runs a separate dQ pass: its tensors are the forward's
    plus gradients and one fp32 dQ accumulator, whatever the key length (a 30k-token d192 backward
    was once refused for "162.9 GiB" of per-key-block partials only the numpy reference keeps)."""
    rng = np.random.default_rng()
    b, hq, hk, s, d = 2, 16, 2, int(rng.integers(20000, 31000)), 192
    p = FmhaProblem(family="bwd_dq_dk_dv", batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=s, seqlen_k=s, hdim_q=d,
                    deterministic=True)
    q_like, kv_like = b * hq * s * d, b * hk * s * d
    # q o do dq dk dv at 2 bytes, k v at 2, lse d at 4 per row, dq_acc fp32
    want = 2 * (4 * q_like + 4 * kv_like) + 4 * q_like + 2 * 4 * b * hq * s
    assert footprint.bytes_moved(p) == pytest.approx(want, rel=0.01)
    q_det = attrs_evolve(p, deterministic=False)
    assert footprint.bytes_moved(q_det) == footprint.bytes_moved(p)
    # the numpy reference does hold one partial per 128-key block
    assert footprint.working_bytes(p, "numpy") > footprint.working_bytes(q_det, "numpy") + 8 * (s // 128 - 2) * q_like


def attrs_evolve(p, **kw):
    import attrs

    return attrs.evolve(p, **kw)
