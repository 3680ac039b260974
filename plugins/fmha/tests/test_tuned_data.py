"""The FMHA tuned tables come from data files (ck_core.tuned_data), equal to the literals they replaced."""
import json
from pathlib import Path

import pytest

from ck_core import tuned_data
from ck_core.errors import ConfigError
from ck_fmha import heuristics as C
from ck_fmha.backends.triton.configs import TritonFmhaConfig

T = TritonFmhaConfig
W = 12  # gluon_fwd.WS_WARPS when the literals were frozen: a producer and two consumer warpgroups

def _pair(v):
    return (T(**v["dkdv"]), T(**v["dq"]))


def _tile(v):
    return (int(v["BLOCK"]), int(v["STAGES"]), bool(v["persistent"]))


def _first(k):
    return k[0]


#: the old Python literal's name -> (table, arch, value converter, key converter)
TABLES = {
    "FWD_DEFAULTS_SM90": ("fwd_defaults", "sm90", lambda v: T(**v), _first),
    "FWD_DEFAULTS_GENERIC": ("fwd_defaults", "generic", lambda v: T(**v), _first),
    "FWD_TUNED_SM90": ("fwd_tuned", "sm90", lambda v: T(**v), tuple),
    "FWD_GLUON_SM90": ("fwd_gluon", "sm90", lambda v: T(**v), tuple),
    "FWD_FP8_TUNED_SM90": ("fwd_fp8", "sm90", lambda v: T(**v), _first),
    "BWD_DEFAULTS_SM90": ("bwd_defaults", "sm90", _pair, _first),
    "BWD_TUNED_SM90": ("bwd_tuned", "generic", _pair, tuple),
    "SPLITKV_DEFAULTS": ("splitkv_defaults", "sm90", lambda v: T(**v), _first),
    "BWD_GLUON_DQ_SM90": ("bwd_gluon_dq", "sm90", _tile, _first),
    "BWD_GLUON_DKDV_SM90": ("bwd_gluon_dkdv", "sm90", _tile, tuple),
    "BWD_GLUON_FUSED_SM90": ("bwd_gluon_fused", "sm90", _tile, tuple),
}


def legacy(name: str) -> dict:
    """The old module-level table ``name``, rebuilt from the data files."""
    tname, arch, conv, key = TABLES[name]
    return {key(k): conv(v) for k, v in C.tuned(tname, arch).items()}


#: a frozen copy of representative entries of the old Python literals (and each table's size)
FROZEN = {
    "FWD_TUNED_SM90": (16, {(64, True, 1024): T(128, 64, 4, 3, "tma"), (64, False, 16384): T(128, 128, 4, 3, "ptr"),
                            (128, True, 512): T(128, 64, 4, 2, "tma_host")}),
    "FWD_GLUON_SM90": (16, {(128, False, 4096): T(128, 128, W, 2, "gluon_wspp_pers"),
                            (128, True, 1024): T(128, 64, W, 4, "gluon_ws_pers"),
                            (64, False, 16384): T(128, 128, W, 3, "gluon_wspp_pers"),
                            (64, True, 4096): T(128, 128, W, 3, "gluon_ws_pers")}),
    "FWD_DEFAULTS_SM90": (5, {64: T(128, 128, 4, 3, "ptr"), 256: T(128, 64, 8, 2, "tma")}),
    "FWD_DEFAULTS_GENERIC": (5, {128: T(128, 64, 8, 2, "ptr"), 256: T(64, 32, 4, 1, "ptr")}),
    "BWD_TUNED_SM90": (4, {(128, False): (T(64, 64, 4, 2), T(128, 128, 8, 2)),
                           (64, True): (T(128, 128, 8, 2), T(64, 64, 4, 3))}),
    "BWD_DEFAULTS_SM90": (5, {256: (T(32, 64, 4, 1), T(64, 32, 4, 1)), 16: (T(64, 128, 8, 3), T(128, 64, 8, 3))}),
    "SPLITKV_DEFAULTS": (5, {128: T(16, 64, 4, 2), 32: T(16, 128, 4, 3)}),
    "FWD_FP8_TUNED_SM90": (1, {128: T(64, 128, 4, 3, "tma_host")}),
    "BWD_GLUON_DQ_SM90": (1, {128: (64, 4, True)}),
    "BWD_GLUON_DKDV_SM90": (4, {(128, False): (64, 3, True), (128, True): (64, 2, False),
                                (64, False): (64, 3, True), (64, True): (64, 3, False)}),
    "BWD_GLUON_FUSED_SM90": (2, {(64, False): (64, 4, False), (64, True): (64, 3, False)}),
}


@pytest.fixture
def user_store(tmp_path, monkeypatch):
    """A private user store (never the real cache), with the load cache cleared around the test."""
    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "tuning.json"))
    tuned_data.clear_cache()
    yield tmp_path / "tuning.d" / "fmha"
    tuned_data.clear_cache()


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_tables_equal_the_old_literals(name, user_store):
    count, some = FROZEN[name]
    got = legacy(name)
    assert len(got) == count
    for k, v in some.items():
        assert got[k] == v, (name, k)
    assert C.gluon_fused_min_seqlen("sm90") == 8192
    assert C.gluon_dq_tile(128, "sm90") == (64, 4, True) and C.gluon_dq_tile(64, "sm90") is None
    assert C.gluon_dkdv_tile(128, True, "sm90") == (64, 2, False)
    assert C.gluon_fused_tile(64, False, "sm90") == (64, 4, False) and C.gluon_fused_tile(128, False, "sm90") is None


def test_no_arch_is_assumed(user_store):
    """Every reader takes the caller's arch; an arch without tables of its own reads the generic ones."""
    import inspect

    for fn in (C.tuned, C.tile_table, C.gluon_dq_tile, C.gluon_dkdv_tile, C.gluon_fused_tile,
               C.gluon_fused_min_seqlen, C.gluon_fwd_configs, C.default_fwd_config, C.default_bwd_configs,
               C.default_splitkv_config):
        arch = inspect.signature(fn).parameters["arch"]
        assert arch.default is inspect.Parameter.empty, fn.__name__
    assert C.gluon_dq_tile(128, "gfx942") is None and C.gluon_fwd_configs(128, "gfx942") == []
    assert C.gluon_fused_min_seqlen("gfx942") == 1 << 62
    assert C.default_fwd_config(128, 128, "gfx942") == C.default_fwd_config(128, 128, "generic")


def test_accessors_read_the_tables(user_store):
    assert C.default_fwd_config(128, 128, "sm90", False, 3000) == T(128, 128, W, 2, "gluon_wspp_pers")
    assert C.default_fwd_config(128, 128, "sm90", False, 3000, gluon=False) == T(128, 64, 4, 2, "tma_host")
    # 96 runs in chunks 64 + 32 on sm90 (fwd_dchunk), pads to 128 where the arch names no chunk
    assert C.default_fwd_config(96, 96, "sm90", False, 4096) == T(128, 64, 4, 3, "tma", 64)
    assert C.default_fwd_config(96, 96, "gfx942", False, 4096) == C.default_fwd_config(128, 128, "gfx942", False, 4096)
    assert C.default_fwd_config(200, 200, "gfx942") == T(64, 32, 4, 1, "ptr")
    assert C.default_fwd_config(16, 16, "gfx942") == T(64, 64, 4, 2, "ptr")
    assert C.default_bwd_configs(128, 128, "sm90", True) == (T(64, 128, 8, 3), T(128, 64, 8, 3))
    assert C.default_bwd_configs(32, 32, "gfx942") == (T(64, 128, 8, 3), T(128, 64, 8, 3))
    assert C.default_splitkv_config(128, 128, 1, "sm90") == T(16, 64, 4, 2)


def test_provenance_present(user_store):
    for arch in ("sm90", "generic"):
        for name, t in tuned_data.tables("fmha", arch, C.TUNED_DIR).items():
            for f in tuned_data.PROVENANCE_FIELDS:
                assert t.provenance[f], (arch, name, f)
    assert "H100" in C.tuned("fwd_gluon", "sm90").provenance["device"]
    assert C.tuned("fwd_gluon", "sm90").provenance["date"] == "2026-11-22"


def test_user_overlay_overrides_a_shipped_entry(user_store):
    before = C.default_fwd_config(64, 64, "sm90", True, 700)
    new = T(64, 32, 4, 2, "ptr")
    tuned_data.write("fmha", "sm90", "fwd_gluon", [((64, True, 1024), new.as_dict())],
                     command="test", device="none", source="test_user_overlay")
    assert C.default_fwd_config(64, 64, "sm90", True, 700) == new != before
    assert C.tuned("fwd_gluon", "sm90").provenance_of((64, True, 1024))["source"] == "test_user_overlay"
    # the other shipped entries stay
    assert C.default_fwd_config(128, 128, "sm90", False, 4096) == T(128, 128, W, 2, "gluon_wspp_pers")
    assert len(legacy("FWD_GLUON_SM90")) == 16


@pytest.mark.parametrize("text", ["{not json", json.dumps([1, 2]),
                                  json.dumps({"format": "ck-dispatcher.tuned-data/1", "op": "fmha", "arch": "sm90",
                                              "tables": {}}),
                                  json.dumps({"format": "ck-dispatcher.tuned-data/1", "op": "fmha", "arch": "sm90",
                                              "provenance": {"command": "x", "date": "d", "device": "v",
                                                             "source": "s"},
                                              "tables": {"fwd_gluon": {"entries": [{"key": 64}]}}})])
def test_garbage_file_is_a_config_error_naming_it(user_store, text):
    user_store.mkdir(parents=True)
    bad = user_store / "sm90.json"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=str(bad)):
        C.default_fwd_config(128, 128, "sm90")


def test_warm_lookup_reads_no_file(user_store, monkeypatch):
    C.default_fwd_config(128, 128, "sm90", True, 4096)
    C.default_bwd_configs(64, 64, "sm90")

    def no_read(*a, **k):
        raise AssertionError("a warm lookup read a file")

    monkeypatch.setattr(Path, "read_text", no_read)
    monkeypatch.setattr(Path, "is_file", no_read)
    monkeypatch.setattr("builtins.open", no_read)
    assert C.default_fwd_config(128, 128, "sm90", True, 4096).variant.startswith("gluon")
    assert C.default_bwd_configs(64, 64, "sm90")[0] == T(32, 128, 4, 3)
    assert C.gluon_dkdv_tile(64, True, "sm90") == (64, 3, False)


def test_gluon_bwd_tiles_equal_the_old_literals(user_store):
    from ck_fmha.backends.triton import gluon_bwd as B
    assert B.tiles("dq", "sm90") == {64: (64, 4, True), 128: (64, 4, True)}
    assert B.tiles("dkdv", "sm90") == {64: (64, 3, True), 128: (64, 2, True)}
    assert B.tiles("fused", "sm90") == {64: (64, 3, True), 128: (64, 2, True)}
    assert B.tiles("dq", "gfx942") == {}
    assert C.tuned("gluon_dkdv_tiles", "sm90").provenance["command"].startswith("hand-picked")


def test_heuristic_reads_the_tables_of_the_dispatchers_arch(user_store):
    """The ranking reads the tables of the ArchSpec it is given: an NVIDIA arch after Hopper is not
    taken for sm90 (it reads the generic tables, like any arch without its own)."""
    import attrs

    from ck_core.plugins import get_manager
    from ck_fmha.heuristics import bwd_want, fwd_want
    from ck_fmha.problem import FmhaProblem

    sm90, gfx942 = get_manager().arch("sm90"), get_manager().arch("gfx942")
    later = attrs.evolve(sm90, name="sm100", triton_target=("cuda", 100))
    p = FmhaProblem(family="fwd", batch=1, nhead_q=2, dtype="bf16", hdim_q=128, seqlen_q=4096, seqlen_k=4096)
    assert fwd_want(p, sm90)[0][4].startswith("gluon")
    assert fwd_want(p, later) == fwd_want(p, gfx942)
    assert all(w[4] == "ptr" for w in fwd_want(p, later))
    pb = FmhaProblem(family="bwd_dq_dk_dv", batch=1, nhead_q=2, dtype="bf16", hdim_q=128, seqlen_q=256,
                     seqlen_k=256, deterministic=True)
    assert bwd_want(pb, later) == bwd_want(pb, gfx942)


def test_launchers_choose_nothing():
    """A kernel-direct call names its kernel: without a config the launcher refuses (issue #30: it used to
    repeat the heuristics' choice from the same tables); the tables' tile is the heuristics' to give."""
    from ck_core.errors import InvalidProblem
    from ck_fmha.backends.triton import launch as ops
    from ck_fmha.backends.triton import launch_bwd as ops_bwd

    import torch

    q = torch.zeros(1, 2, 128, 64, dtype=torch.float16)
    assert ops._arch_of(q) is None and ops.fp8_v_trans_default(q)
    assert not hasattr(ops, "default_fwd_choice") and not hasattr(ops, "default_bwd_choice")
    with pytest.raises(InvalidProblem, match="config is required"):
        ops.fwd(q, q, q)
    with pytest.raises(InvalidProblem, match="choice .or config. is required"):
        ops_bwd.bwd_dq_dk_dv(q, q, q, q, torch.zeros(1, 2, 128), torch.zeros(1, 2, 128))
    assert C.default_fwd_config(64, 64, "generic", seqlen=128).variant == "ptr"
