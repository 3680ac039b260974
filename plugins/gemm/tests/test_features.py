"""The GEMM ranker's tile-fit features, checked against per-key arithmetic written here."""
import math

import numpy as np
import pytest

from ck_core.api import dispatcher_for
from ck_core.plugins import get_manager
from ck_gemm import features
from ck_gemm.problem import GemmProblem


@pytest.mark.parametrize("m,n,k,batch,layout", [(37, 1000, 200, 1, "rcr"), (1, 4099, 77, 3, "rrr")])
def test_tile_fit_features_match_a_hand_count(m, n, k, batch, layout):
    arch = get_manager().arch("sm90")
    p = GemmProblem(m, n, k, batch=batch, dtype="fp16", layout=layout)
    d = dispatcher_for("gemm", "sm90", "triton", dtypes=("fp16",), layouts=(layout,), dtypes_c=("fp16",),
                       num_ds=(0,), d_ops=("add",), activations=("none",))
    keys = d.registry.candidates(p, backend="triton")
    assert len(keys) > 10
    cols = features.features(p, keys, arch)
    sms = arch.compute_units
    for i, key in enumerate(keys):
        a = key.algorithm
        tiles_m, tiles_n = -(-m // a.tile_m), -(-n // a.tile_n)
        iters = -(-k // (a.tile_k * a.split_k))
        programs = tiles_m * tiles_n * batch * a.split_k
        assert cols["tail_m"][i] == pytest.approx(m / (tiles_m * a.tile_m))
        assert cols["tail_n"][i] == pytest.approx(n / (tiles_n * a.tile_n))
        assert cols["tail_k"][i] == pytest.approx(k / (iters * a.tile_k * a.split_k))
        assert cols["v_streamk"][i] == float(a.variant in ("streamk", "tma_streamk"))
        if cols["v_streamk"][i]:
            # stream-K: the K steps of the tiles are shared by up to every SM; the last wave is full
            units = tiles_m * tiles_n * batch * iters
            shared = max(programs, min(units, sms, 8 * programs))
            assert cols["wave_frac"][i] == 1.0
            assert cols["sm_busy"][i] == pytest.approx(min(shared, sms) / sms)
            continue
        frac = programs / sms - programs // sms
        assert cols["wave_frac"][i] == pytest.approx(frac if frac else 1.0)
        assert cols["sm_busy"][i] == pytest.approx(min(programs, sms) / sms)
        assert cols["tile_bytes_per_flop"][i] == pytest.approx(2 * (a.tile_m + a.tile_n) / (2 * a.tile_m * a.tile_n))
        # residency: pipeline buffers (stages x (A tile + B tile), fp16) against the SM's shared memory
        smem = max(a.stages, 1) * (a.tile_m + a.tile_n) * a.tile_k * 2
        warps = a.warp_m * a.warp_n * a.warp_k
        per_sm = max(1, min(arch.lds_bytes // smem, 64 // warps))
        waves = -(-programs // (sms * per_sm))
        assert cols["ctas_per_sm"][i] == per_sm
        assert cols["log_waves_res"][i] == pytest.approx(math.log2(waves))
        assert cols["occupancy_res"][i] == pytest.approx(programs / (waves * sms * per_sm))
    lda = k if layout[0] == "r" else m
    ldb = n if layout[1] == "r" else k
    assert set(cols["tma_ok_a"]) == {float(lda * 2 % 16 == 0)}
    assert set(cols["tma_ok_b"]) == {float(ldb * 2 % 16 == 0)}
    assert set(cols["tma_ok_c"]) == {float(n * 2 % 16 == 0)}
    ranks = cols["rank_roofline"]
    assert sorted(np.round(ranks * len(keys)).astype(int)) == list(range(len(keys)))
    assert ranks[int(np.argmin(cols["log_roofline"]))] == 0.0
    assert all(math.isfinite(v) for c in cols.values() for v in np.asarray(c))


def _sm90(layout):
    return dispatcher_for("gemm", "sm90", "triton", dtypes=("bf16",), layouts=(layout,), dtypes_c=("bf16",),
                          num_ds=(0,), d_ops=("add",), activations=("none",))


def test_row_major_b_beyond_the_rankers_rrr_data_goes_to_the_heuristic(monkeypatch):
    """The shipped sm90 ranker saw descriptor-aligned rrr problems only up to M = 64 (its larger rrr
    shapes were unaligned: pointer keys only).  A larger aligned rrr problem lies outside its
    domain (the feature ``log_m_brow_desc``), so the heuristic orders it; rcr is unchanged."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from ck_core import ranker

    mgr = get_manager()
    op, arch = mgr.op("gemm"), mgr.arch("sm90")
    model = ranker.model_for(op, "sm90", "triton")
    assert model is not None and "log_m_brow_desc" in model.domain
    rng = np.random.default_rng()
    m = int(rng.integers(300, 1001))
    for lay, ranked in (("rrr", False), ("rcr", True)):
        p = GemmProblem(m, 4096, 11008, dtype="bf16", layout=lay)
        cands = _sm90(lay).registry.candidates(p, backend="triton")
        cols = features.features(p, cands, arch)
        assert cols["log_m_brow_desc"][0] == (math.log2(m) if lay == "rrr" else 0.0)
        assert (ranker.rank(model, op, p, cands, arch) is not None) == ranked
    # an unaligned rrr problem (pointer keys only, as trained) and a small aligned one stay ranked
    for m, n in ((700, 4099), (48, 4096)):
        p = GemmProblem(m, n, 4096, dtype="bf16", layout="rrr")
        cands = _sm90("rrr").registry.candidates(p, backend="triton")
        assert ranker.rank(model, op, p, cands, arch) is not None
    # what the Dispatcher picks for the aligned one: no register-spilling pointer tile (>= 128
    # accumulators a thread: 0.17-0.45 of the best in the oracle's rrr rows)
    p = GemmProblem(700, 4096, 11008, dtype="bf16", layout="rrr")
    d = _sm90("rrr")
    a = d.select(p).algorithm
    assert a.variant.startswith("tma") or a.tile_m * a.tile_n < 128 * 32 * a.num_warps, a
