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
