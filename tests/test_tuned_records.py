"""Tuning stores, user overlays and ranker models are untrusted input: each record type has one
validator, run where the record is read, and a bad record is a ConfigError naming the file and
the entry -- never an internal error, never a kernel launched with it.

Covers: the tuned-data store itself (nesting, encoding, size), the op plugins' overlay tables
(FMHA configs and tiles, conv split targets and lists, GEMM winners), the core's ``kernels``
winners and ranker models.
"""
import json
import math

import pytest

from ck_core import tuned_data
from ck_core.errors import ConfigError

PROV = {"command": "test", "date": "2026-11-29", "device": "cpu", "source": "test_tuned_records"}


@pytest.fixture
def user_store(tmp_path, monkeypatch):
    """The user's store under tmp_path (never the real cache); yields its folder."""
    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "tuning.json"))
    tuned_data.clear_cache()
    yield tmp_path / "tuning.d"
    tuned_data.clear_cache()


def _overlay(op, arch, name, entries, fields):
    path = tuned_data.write(op, arch, name, entries, command="test", device="cpu", source="hostile overlay",
                            fields=fields)
    tuned_data.clear_cache()
    return path


# -- the store file itself ----------------------------------------------------------------------

def _store_file(user_store, op="toy", arch="a1"):
    p = user_store / op / f"{arch}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


@pytest.mark.parametrize("content,says", [
    (b"[" * 200000 + b"]" * 200000, "too deeply"),
    (b'{"format": "\xff"}', "UTF-8"),
    (json.dumps({"format": tuned_data.FORMAT, "op": "toy", "arch": "a1", "provenance": PROV,
                 "tables": {"t": {"key": ["a"], "entries": [{"key": [1], "value": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
                     [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
                 ]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}]}}}).encode(), "deeper than"),
    (json.dumps({"format": tuned_data.FORMAT, "op": "toy", "arch": "a1", "provenance": PROV,
                 "tables": {"t": {"key": [1, 2], "entries": []}}}).encode(), "field names"),
], ids=["nested_200k", "not_utf8", "nested_67", "key_not_names"])
def test_hostile_store_files(user_store, content, says):
    p = _store_file(user_store)
    p.write_bytes(content)
    with pytest.raises(ConfigError, match=says) as err:
        tuned_data.tables("toy", "a1", shipped=user_store / "none")
    assert str(p) in str(err.value)


def test_an_oversized_store_file_is_not_read(user_store):
    p = _store_file(user_store)
    with open(p, "wb") as f:
        f.truncate(tuned_data.MAX_FILE_BYTES + 1)   # sparse
    with pytest.raises(ConfigError, match="MiB"):
        tuned_data.tables("toy", "a1", shipped=user_store / "none")


def test_a_check_runs_once_per_loaded_table_and_names_the_entry(user_store):
    calls = []

    def check(key, value):
        calls.append(key)
        if value < 0:
            raise ValueError("negative")
    _overlay("toy", "a1", "t", [((1,), 5), ((2,), 6)], ("a",))
    t = tuned_data.table("toy", "a1", "t", user_store / "none", check=check)
    tuned_data.table("toy", "a1", "t", user_store / "none", check=check)
    assert len(t) == 2 and len(calls) == 2
    path = _overlay("toy", "a1", "t", [((3,), -1)], ("a",))
    with pytest.raises(ConfigError, match=r"entry \[3\]: negative") as err:
        tuned_data.table("toy", "a1", "t", user_store / "none", check=check)
    assert str(path) in str(err.value)


# -- FMHA: configurations and tiles ---------------------------------------------------------------

GOOD_CFG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "variant": "ptr"}
BAD_CFGS = {
    "block_m_7": dict(GOOD_CFG, BLOCK_M=7),
    "block_m_2_20": dict(GOOD_CFG, BLOCK_M=1 << 20),
    "block_n_negative": dict(GOOD_CFG, BLOCK_N=-64),
    "block_m_string": dict(GOOD_CFG, BLOCK_M="64"),
    "warps_bool": dict(GOOD_CFG, num_warps=True),
    "stages_0": dict(GOOD_CFG, num_stages=0),
    "variant_path": dict(GOOD_CFG, variant="../../x"),
    "unknown_field": dict(GOOD_CFG, evil=1),
    "dchunk_48": dict(GOOD_CFG, DCHUNK=48),
    "not_an_object": "BLOCK_M=64",
}


@pytest.mark.parametrize("name", BAD_CFGS)
def test_fmha_overlay_configs_are_checked_when_read(user_store, name):
    pytest.importorskip("ck_fmha")
    from ck_fmha.heuristics import default_fwd_config

    path = _overlay("fmha", "sm90", "fwd_tuned", [((64, False, 512), BAD_CFGS[name])],
                    ("hdim", "causal", "seqlen_bucket"))
    with pytest.raises(ConfigError, match="fwd_tuned") as err:
        default_fwd_config(64, 64, "sm90", causal=False, seqlen=512, gluon=False)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("table,key,value", [
    ("fwd_tuned", (64, "no", 512), GOOD_CFG),
    ("fwd_tuned", (64, False, 513), GOOD_CFG),
    ("bwd_tuned", (64, False), {"dkdv": GOOD_CFG}),
    ("bwd_tuned", (64, False), {"dkdv": GOOD_CFG, "dq": dict(GOOD_CFG, variant="kvsplit", num_stages=99)}),
    ("bwd_gluon_dkdv", (128, False), {"BLOCK": 48, "STAGES": 3, "persistent": True}),
    ("bwd_gluon_dkdv", (128, False), {"BLOCK": 64, "STAGES": 3, "persistent": "yes"}),
    ("bwd_gsplit", ("triton",), {"waves": -1}),
], ids=["causal_str", "seq_bucket", "bwd_missing_dq", "bwd_stages", "gluon_block", "gluon_persistent",
        "gsplit_negative"])
def test_fmha_other_tables(user_store, table, key, value):
    pytest.importorskip("ck_fmha")
    from ck_fmha import heuristics as tuning
    from ck_fmha.heuristics import CHECKS

    _overlay("fmha", "sm90", table, [(key, value)], ())
    with pytest.raises(ConfigError, match=table):
        tuning.tuned(table, "sm90")


def test_fmha_shipped_tables_pass_their_checks(user_store):
    pytest.importorskip("ck_fmha")
    from ck_fmha import heuristics as tuning
    from ck_fmha.heuristics import CHECKS

    for arch in ("sm90", "generic"):
        for name in CHECKS:
            tuning.tuned(name, arch)
    good = tuning.default_fwd_config(64, 64, "sm90", causal=False, seqlen=512, gluon=False)
    assert good.BLOCK_M in (16, 32, 64, 128, 256)


# -- conv and GEMM ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["abc", -2, 0, float("inf"), [1, 2], None, True])
def test_conv_split_target_overlay(user_store, value):
    pytest.importorskip("ck_conv")
    from ck_conv import heuristics

    path = _overlay("conv", "generic", "split_target", [(("default",), value)], ("kind",))
    with pytest.raises(ConfigError, match="split_target") as err:
        heuristics._split_target("default")
    assert str(path) in str(err.value)


def test_conv_list_tables(user_store):
    pytest.importorskip("ck_conv")
    from ck_conv import heuristics

    _overlay("conv", "generic", "flat", [(("forward",), [[[128, 64, "../x"], 4]])], ("list",))
    with pytest.raises(ConfigError, match="flat"):
        heuristics._lists("flat", "forward")


@pytest.mark.parametrize("value", [{"config": "tri_plain_m7n64k64_g1_w4_s3_sk1"}, {"config": 5},
                                   {"config": "tri_plain_m1048576n64k64_g1_w4_s3_sk1"},
                                   {"config": "tri_plain_m64n64k64_g1_w4_s3_sk1", "shape": [64, "x", 64]},
                                   {"config": "tri_plain_m64n64k64_g1_w4_s3_sk1", "shape": [64, -64, 64]}])
def test_gemm_kernels_overlay(user_store, value):
    pytest.importorskip("ck_gemm")
    from ck_gemm.heuristics import load_table

    _overlay("gemm", "sm90", "kernels", [(("triton", '["fp16", "fp16", "rcr", 64, 64, 64]'), value)],
             ("backend", "bucket"))
    with pytest.raises(ConfigError, match="kernels"):
        load_table("sm90")


# -- the core's records --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [{"kernel": ""}, {"kernel": 5}, {"kernel": "gemm_x", "seconds": -1},
                                   {"kernel": "gemm_x", "seconds": "1"}, "gemm_x"])
def test_winners_kernels_records(user_store, value):
    from ck_core.problem import Problem
    from ck_core.winners import TABLE, Winners

    class P(Problem):
        op = "toy"

        def bucket(self):
            return (1,)

    _overlay("toy", "a1", TABLE, [(("numpy", "[1]"), value)], ("backend", "bucket"))
    with pytest.raises(ConfigError, match="kernels"):
        Winners().lookup("a1", "numpy", P())


@pytest.mark.parametrize("seconds", ["NaN", "Infinity", "1e999"])
def test_winners_seconds_must_be_finite(user_store, seconds):
    from ck_core.problem import Problem
    from ck_core.winners import Winners

    class P(Problem):
        op = "toy"

        def bucket(self):
            return (1,)

    p = _store_file(user_store)
    p.write_text(json.dumps({"format": tuned_data.FORMAT, "op": "toy", "arch": "a1", "provenance": PROV,
                             "tables": {"kernels": {"key": ["backend", "bucket"], "entries": [
                                 {"key": ["numpy", "[1]"], "value": {"kernel": "k", "seconds": 0.5}}]}}})
                 .replace("0.5", seconds))
    with pytest.raises(ConfigError, match=f"{p}.*(finite|NaN|Infinity)"):
        Winners().lookup("a1", "numpy", P())


GBDT = {"kind": "gbdt", "features": ["x"], "trees": {"feature": [0, -1, -1], "threshold": [0.5, 0, 0],
                                                     "left": [1, 1, 2], "right": [2, 1, 2], "value": [0, -1, 1],
                                                     "roots": [0], "depth": 1}}


@pytest.mark.parametrize("change,says", [
    ({"domain": {"x": [None, 1]}}, "domain"), ({"domain": {"x": ["0", 1]}}, "domain"),
    ({"domain": {"x": [2, 1]}}, "low <= high"), ({"kernel_domain": {"v": [0, None]}}, "kernel_domain"),
    ({"domain": {"x": [True, 1]}}, "domain"), ({"domain": [0, 1]}, "domain"),
    ({"base": float("nan")}, "finite"),
], ids=["null_low", "string_low", "reversed", "kernel_null", "bool", "not_a_map", "nan_base"])
def test_ranker_models_are_checked(change, says):
    from ck_core.ranker import Model

    Model(GBDT)   # the good one loads
    with pytest.raises(ConfigError, match=says):
        Model({**GBDT, **change})
    lin = {"kind": "linear", "features": ["x"], "coef": [float("inf")]}
    with pytest.raises(ConfigError, match="finite"):
        Model(lin)
    assert math.isfinite(Model({**lin, "coef": [1.0]}).predict([[2.0]])[0])


def test_a_ranker_too_large_is_not_read(user_store):
    p = _store_file(user_store, "toy", "a1")
    with open(p, "wb") as f:
        f.truncate(100 << 20)   # a 100 MB "model", sparse
    with pytest.raises(ConfigError, match="MiB"):
        tuned_data.table("toy", "a1", "ranker", user_store / "none")
