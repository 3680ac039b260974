"""FMHA kernel enumeration: CK parity, names, receipts, arches, sweeps.

Run from the repository root::

    .venv/bin/python -m pytest plugins/fmha/tests/test_enumeration.py -q -s

(``-s`` shows the printed count and timing tables.)
"""
from __future__ import annotations

import collections
import gzip
import json
import logging
import re
import sys
import time
from pathlib import Path

import pytest

_PLUGIN_ROOT = Path(__file__).resolve().parents[1]
_REPO_ROOT = Path(__file__).resolve().parents[3]
for _p in (_PLUGIN_ROOT, _REPO_ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from ck_core.errors import ConfigError  # noqa: E402
from ck_fmha.codegen import (  # noqa: E402
    ARCHES,
    FAMILIES,
    RECEIPTS,
    FmhaKernelSpec,
    count_kernels,
    enumerate_kernels,
    load_sweep,
    parse_name,
    spec_from_ck_name,
)
from ck_fmha.codegen import enumerate as enum_mod  # noqa: E402
from ck_fmha.codegen.ck_facts import arch_pipelines  # noqa: E402
from ck_fmha.codegen.spec import FAMILY_FIELDS  # noqa: E402
from ck_fmha.codegen.sweep import parse_sweep  # noqa: E402

# CK's own kernel list for gfx950 receipt 0 (copied from shared/oracle, see its README)
ORACLE = Path(__file__).resolve().parent / "data" / "fmha_gfx950_receipt0.txt.gz"
CONFIGS = _PLUGIN_ROOT / "configs"

EXACT_FAMILIES = ("fwd", "bwd_dq_dk_dv", "bwd_dot_do_o", "bwd_convert_dq")
# Families whose CK rules did not change between the oracle's CK and the newest.
UNCHANGED_FAMILIES = ("fwd_splitkv_combine", "fwd_appendkv")

# Longest prefix first: each oracle name belongs to exactly one family.
_PREFIXES = (
    ("fmha_fwd_splitkv_combine_", "fwd_splitkv_combine"),
    ("fmha_fwd_splitkv_", "fwd_splitkv"),
    ("fmha_fwd_pagedkv_", "fwd_pagedkv"),
    ("fmha_fwd_appendkv_", "fwd_appendkv"),
    ("fmha_batch_prefill_", "batch_prefill"),
    ("fmha_bwd_dot_do_o_", "bwd_dot_do_o"),
    ("fmha_bwd_convert_dq_", "bwd_convert_dq"),
    ("fmha_bwd_", "bwd_dq_dk_dv"),
    ("fmha_fwd_", "fwd"),
)

# gfx950 receipt 0 with the newest CK rules (a regression lock; see the report).
EXPECTED_GFX950_R0 = {
    "fwd": 11980,
    "fwd_splitkv": 2952,
    "fwd_splitkv_combine": 138,
    "fwd_pagedkv": 252,
    "fwd_appendkv": 99,
    "batch_prefill": 9456,
    "bwd_dot_do_o": 60,
    "bwd_dq_dk_dv": 12000,
    "bwd_convert_dq": 144,
}


def _family_of(name: str) -> str:
    for prefix, family in _PREFIXES:
        if name.startswith(prefix):
            return family
    raise AssertionError(f"oracle name with unknown prefix: {name}")


@pytest.fixture(scope="module")
def oracle():
    assert ORACLE.is_file(), f"oracle list {ORACLE} is missing from the repository"
    with gzip.open(ORACLE, "rt") as fh:
        names = [line.strip() for line in fh if line.strip()]
    by_family = collections.defaultdict(set)
    for n in names:
        by_family[_family_of(n)].add(n)
    assert sum(len(v) for v in by_family.values()) == len(names), "oracle has duplicates"
    return by_family


@pytest.fixture(scope="module")
def gfx950_r0():
    specs = enumerate_kernels("gfx950", 0)
    by_family = collections.defaultdict(list)
    for s in specs:
        by_family[s.family].append(s)
    return specs, by_family


# ---------------------------------------------------------------------------
# Parity
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", EXACT_FAMILIES)
def test_exact_parity_with_oracle(family, oracle, gfx950_r0):
    _, by_family = gfx950_r0
    ours = [s.ck_name for s in by_family[family]]
    assert len(set(ours)) == len(ours), "two specs share a CK name"
    missing = sorted(oracle[family] - set(ours))
    extra = sorted(set(ours) - oracle[family])
    assert not missing and not extra, (
        f"{family}: {len(missing)} missing (e.g. {missing[:3]}), {len(extra)} extra (e.g. {extra[:3]})"
    )


@pytest.mark.parametrize("family", UNCHANGED_FAMILIES)
def test_unchanged_families_match_oracle(family, oracle, gfx950_r0):
    _, by_family = gfx950_r0
    assert {s.ck_name for s in by_family[family]} == oracle[family]


@pytest.mark.parametrize("family", ["fwd_splitkv", "fwd_pagedkv"])
def test_sink_switch_is_the_only_change(family, oracle, gfx950_r0):
    """Newest CK adds sink on/off: sink-off kernels are the oracle's, renamed."""
    _, by_family = gfx950_r0
    specs = by_family[family]
    sink_off = {s.ck_name.replace("_nsink", "") for s in specs if not s.sink}
    assert sink_off == oracle[family]
    sink_on = [s for s in specs if s.sink]
    assert sink_on and all(s.dtype in ("fp16", "bf16") for s in sink_on)
    assert len(specs) == len(oracle[family]) + len(sink_on)


def test_batch_prefill_relation(oracle, gfx950_r0):
    """Old batch-prefill group kernels survive (as one KV-cache variant each);
    the old batch-mode kernels are gone (batch prefill is group-only now)."""
    _, by_family = gfx950_r0
    specs = by_family["batch_prefill"]
    assert {s.mode for s in specs} == {"group"}
    assert {s.page_size for s in specs} == {1, 16, 1024}
    assert {s.kv_layout for s in specs} == {"vectorized", "linear"}
    assert {s.kv_lookup for s in specs} == {"vllm", "sglang"}
    assert all(s.kv_layout == "linear" for s in specs if s.page_size == 1)

    def old_style(s):
        n = re.sub(r"_ps\d+_(64bit_)?", "_", s.ck_name)
        n = n.replace("_nqscale", "_nsquant").replace("_nsink", "")
        return re.sub(r"_(vectorized|linear)_(vllm|sglang)$", "", n)

    projected = {old_style(s) for s in specs if not s.sink and s.qscale == "no"}
    old_group = {n for n in oracle["batch_prefill"] if "_group_" in n}
    old_batch = oracle["batch_prefill"] - old_group
    assert old_group <= projected
    assert not (old_batch & projected)


def test_counts_gfx950_receipt0(gfx950_r0, oracle):
    specs, by_family = gfx950_r0
    counts = {fam: len(by_family[fam]) for fam in FAMILIES}
    print("\nfamily                 ours  oracle")
    for fam in FAMILIES:
        print(f"{fam:<22}{counts[fam]:>6}{len(oracle[fam]):>8}")
    print(f"{'total':<22}{len(specs):>6}{sum(len(v) for v in oracle.values()):>8}")
    no64 = enumerate_kernels("gfx950", 0, ["batch_prefill"], batch_prefill_64bit=False)
    print(f"total without batch-prefill 64-bit variants: {len(specs) - len(by_family['batch_prefill']) + len(no64)}")
    assert counts == EXPECTED_GFX950_R0
    assert count_kernels("gfx950", 0) == EXPECTED_GFX950_R0


def test_enumeration_time():
    arches_times = {}
    for arch in ARCHES:
        enum_mod._run_family_cached.cache_clear()
        enum_mod._run_bwd_cached.cache_clear()
        t0 = time.perf_counter()
        n = len(enumerate_kernels(arch, 0))
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        enumerate_kernels(arch, 0)
        arches_times[arch] = (n, cold, time.perf_counter() - t0)
    print("\nall nine families, receipt 0:")
    for arch, (n, cold, warm) in arches_times.items():
        print(f"  {arch:<8} {n:>6} kernels: {cold * 1000:7.1f} ms cold, {warm * 1000:5.2f} ms cached")
    assert arches_times["gfx950"][1] < 5.0  # generous: the target is well under 1 s


# ---------------------------------------------------------------------------
# Names and records
# ---------------------------------------------------------------------------


def test_name_round_trip_every_spec(gfx950_r0):
    specs, _ = gfx950_r0
    names = set()
    for s in specs:
        n = s.name
        assert parse_name(n) == s  # parse_name runs the validators
        names.add(n)
    assert len(names) == len(specs)
    assert len({s.ck_name for s in specs}) == len(specs)  # name <-> ck_name one-to-one


def test_dict_round_trip_is_json_safe(gfx950_r0):
    specs, by_family = gfx950_r0
    for fam in FAMILIES:
        for s in by_family[fam][:50]:
            d = json.loads(json.dumps(s.to_dict()))
            assert FmhaKernelSpec.from_dict(d) == s
            assert FmhaKernelSpec.from_name(s.name) == s


def test_family_fields_cover_what_names_encode():
    for arch in ARCHES:
        for s in enumerate_kernels(arch, 0):
            for field in FmhaKernelSpec.__attrs_attrs__:
                if field.name not in FAMILY_FIELDS[s.family]:
                    assert getattr(s, field.name) == field.default, (s.family, field.name)


def test_spec_from_ck_name(gfx950_r0):
    specs, _ = gfx950_r0
    for s in specs[::997]:
        assert spec_from_ck_name(s.ck_name, "gfx950") == s
    with pytest.raises(ConfigError):
        spec_from_ck_name("fmha_fwd_nonsense_gfx950", "gfx950")


def test_name_examples(gfx950_r0):
    specs, by_family = gfx950_r0
    s = by_family["fwd"][0]
    assert s.name.startswith("fmha.fwd.gfx950.dtype-")
    assert s.ck_name.endswith("_gfx950")
    assert by_family["fwd_splitkv"][0].ck_name.endswith("_gfx9")
    assert not by_family["batch_prefill"][0].ck_name.endswith("_gfx9")


# ---------------------------------------------------------------------------
# Other arches and receipts
# ---------------------------------------------------------------------------

# every receipt but 801, which is empty with --mask generic (see test_receipt_filters_follow_ck)
SPOT_RECEIPTS = tuple(r for r in RECEIPTS if r != 801)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("receipt", SPOT_RECEIPTS)
def test_arch_receipt_spot_checks(arch, receipt):
    specs = enumerate_kernels(arch, receipt)
    if receipt == 800 and arch in ("gfx1100", "gfx1201"):
        assert specs == []  # CK has no fp32 FMHA tiles for gfx11/gfx12
        return
    assert specs, f"{arch} receipt {receipt} is empty"
    ck_names = [s.ck_name for s in specs]
    assert len(set(ck_names)) == len(ck_names), "duplicate CK names"
    assert len({s.name for s in specs}) == len(specs), "duplicate names"
    pipelines = {s.pipeline for s in specs}
    assert pipelines - {""} <= set(arch_pipelines(arch))
    trload = [s for s in specs if s.trload]
    if arch == "gfx950":
        if receipt in (0, 1):
            assert {"qr_async_trload", "qr_async_trload_v3"} <= pipelines
    else:
        assert not trload, "trload kernels only exist on gfx950"
        assert not pipelines & {"qr_async_trload", "qr_async_trload_v3"}
    if "qr_nwarp_sshuffle" in pipelines:
        assert arch in ("gfx1100", "gfx1201")
    if arch in ("gfx1100", "gfx1201"):
        assert not any(s.family == "batch_prefill" for s in specs)
        assert "qr_async" not in pipelines
    if arch == "gfx1100":
        assert not any(s.family == "fwd_appendkv" for s in specs)
    suffix = {"gfx90a": "_gfx9", "gfx942": "_gfx9", "gfx950": None,
              "gfx1100": "_gfx11", "gfx1201": "_gfx12"}[arch]
    for s in specs:
        if s.family == "batch_prefill":
            continue
        if suffix is None:
            want = "_gfx950" if s.family in ("fwd",) or s.family.startswith("bwd") else "_gfx9"
        else:
            want = suffix
        assert s.ck_name.endswith(want), s.ck_name
        assert s.ck_name.count("_gfx") == 1


def test_receipt_filters_follow_ck():
    fp32 = enumerate_kernels("gfx942", 800)
    assert fp32 and {s.dtype for s in fp32} == {"fp32"}
    assert {s.family for s in fp32} == {"fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"}
    assert not any(s.logits or s.skip for s in fp32 if s.family == "fwd")

    flash = enumerate_kernels("gfx950", 2, ["fwd"])
    assert flash and not any(s.sink or s.skip or s.qscale != "no" or s.bias == "bias" for s in flash)

    fp8 = enumerate_kernels("gfx950", 888, ["fwd"])
    assert fp8 and {s.dtype for s in fp8} <= {"fp8bf16", "fp8fp32"}
    assert {s.hdim_q for s in fp8} <= {128, 192}

    r1 = enumerate_kernels("gfx950", 1, ["fwd"])
    r0 = enumerate_kernels("gfx950", 0, ["fwd"])
    extra = set(r1) - set(r0)
    assert extra and all(s.pipeline == "qr" and s.bias != "bias" for s in extra)

    # 801 asks for the simplified mask "s_no": empty with --mask generic, as in CK
    assert enumerate_kernels("gfx950", 801) == []
    minimal = enumerate_kernels("gfx950", 801, mask_impl="simplified")
    assert minimal and {s.dtype for s in minimal} == {"fp32"} and {s.mode for s in minimal} == {"batch"}

    group = enumerate_kernels("gfx950", 400, ["bwd_dq_dk_dv"])
    assert group and {s.mode for s in group} == {"group"}


def test_simplified_masks():
    specs = enumerate_kernels("gfx942", 0, ["fwd", "bwd_dq_dk_dv"], mask_impl="simplified")
    assert {s.mask for s in specs} <= {"s_no", "s_mask", "no", "causal"}  # v3 keeps CK's literal masks
    assert any(s.ck_name.split("_gfx")[0].endswith("ntrload") for s in specs)


def test_families_argument_and_order():
    specs = enumerate_kernels("gfx950", 0, ["bwd_convert_dq", "fwd_appendkv"])
    fams = [s.family for s in specs]
    assert fams == ["bwd_convert_dq"] * 144 + ["fwd_appendkv"] * 99
    assert enumerate_kernels("gfx950", 0, "fwd_appendkv") == enumerate_kernels("gfx950", 0, ["fwd_appendkv"])
    a = enumerate_kernels("gfx950", 0, ["fwd_appendkv"])
    a.clear()  # callers get their own list
    assert len(enumerate_kernels("gfx950", 0, ["fwd_appendkv"])) == 99


# ---------------------------------------------------------------------------
# Invalid inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, needle", [
    (dict(arch="gfx1030"), "gfx950"),
    (dict(arch="gfx950", receipt=5), "ck_default"),
    (dict(arch="gfx950", receipt="nosuch"), "pytorch"),
    (dict(arch="gfx950", receipt=2.5), "receipt"),
    (dict(arch="gfx950", receipt=True), "receipt"),
    (dict(arch="gfx950", families=["fwd", "fwd2"]), "bwd_dq_dk_dv"),
    (dict(arch="gfx950", mask_impl="fancy"), "simplified"),
])
def test_invalid_inputs_raise_config_error(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        enumerate_kernels(**kwargs)


def test_receipt_by_name_or_number():
    from ck_fmha.codegen.enumerate import receipt_number

    assert receipt_number("pytorch") == receipt_number("4") == receipt_number(4) == 4
    assert enumerate_kernels("gfx950", "ck_default", ["fwd_appendkv"]) == \
        enumerate_kernels("gfx950", 0, ["fwd_appendkv"])


@pytest.mark.parametrize("bad", [
    "fwd.gfx950.dtype-fp16",
    "fmha.fwd.gfx950.dtype-fp16.hdim_q-x.hdim_v-64",
    "fmha.fwd.gfx950.dtype-fp16.hdim_q-64.hdim_v-64.colour-red",
    "fmha.fwd.gfx950.dtype-fp16.hdim_q-64",
    "fmha.fwd.gfx999.dtype-fp16.hdim_q-64.hdim_v-64",
    "fmha.fwd.gfx950.dtype-fp64.hdim_q-64.hdim_v-64",
    "fmha.fwd.gfx950.dtype-fp16.hdim_q-64.hdim_v-64.lse-2",
])
def test_parse_name_rejects_bad_names(bad):
    with pytest.raises(ConfigError):
        parse_name(bad)


def test_record_validation():
    with pytest.raises(ConfigError, match="dtype"):
        FmhaKernelSpec(family="fwd", arch="gfx950", dtype="fp64", hdim_q=64, hdim_v=64)
    with pytest.raises(ConfigError, match="unknown FmhaKernelSpec field"):
        FmhaKernelSpec.from_dict({"family": "fwd", "arch": "gfx950", "dtype": "fp16",
                                  "hdim_q": 64, "hdim_v": 64, "colour": "red"})
    with pytest.raises(ConfigError, match="tile"):
        FmhaKernelSpec(family="fwd", arch="gfx950", dtype="fp16", hdim_q=64, hdim_v=64, tile=[1, 2])


def test_debug_log_says_why(caplog):
    with caplog.at_level(logging.DEBUG, logger="ck_fmha.codegen.enumerate"):
        specs = enumerate_kernels("gfx942", 2, ["fwd_pagedkv", "batch_prefill"])
    text = caplog.text
    assert specs
    assert "culled" in text
    assert "receipt: flash needs fp16/bf16" in text
    assert "logits soft-cap needs no bias" in text
    assert "fwd_pagedkv/gfx942: kept" in text


# ---------------------------------------------------------------------------
# Sweep configs
# ---------------------------------------------------------------------------


def test_example_configs_load_and_filter():
    r0 = load_sweep(CONFIGS / "receipt0_fwd.json")
    assert r0.arch == "gfx950" and r0.families == ("fwd",)
    assert len(r0.enumerate()) == 11980

    ci = load_sweep(CONFIGS / "fwd_ci.json")
    kernels = ci.enumerate(arch="gfx950")
    assert kernels
    for s in kernels:
        assert (s.dtype, s.pipeline, s.mask, s.bias, s.mode) == ("fp16", "qr_async", "no", "no", "batch")
        assert not (s.lse or s.dropout or s.logits or s.sink)

    toml = load_sweep(CONFIGS / "splitkv_decode.toml")
    ks = toml.enumerate()
    fams = collections.Counter(s.family for s in ks)
    assert fams["fwd_splitkv"] and fams["fwd_splitkv_combine"]  # bias/logits don't filter combine
    assert all(s.hdim_q == 128 and s.mode == "batch" for s in ks)
    print(f"\nexample sweeps: receipt0_fwd={len(r0.enumerate())} fwd_ci={len(kernels)} "
          f"splitkv_decode.toml={len(ks)}")


def test_toml_and_json_agree(tmp_path):
    body = {"variant": "bwd", "trait_config": {"data_type": {"values": ["bf16"]},
                                               "deterministic": {"values": [False]},
                                               "tile_n0": {"values": [128]}}}
    (tmp_path / "c.json").write_text(json.dumps(body))
    (tmp_path / "c.toml").write_text(
        'variant = "bwd"\n[trait_config]\ndata_type = { values = ["bf16"] }\n'
        'deterministic = [false]\ntile_n0 = { values = [128] }\n')
    a = load_sweep(tmp_path / "c.json").enumerate(arch="gfx950")
    b = load_sweep(tmp_path / "c.toml").enumerate(arch="gfx950")
    assert a == b and a
    assert all(s.dtype == "bf16" and not s.deterministic for s in a)
    assert all(s.tile[1] == 128 for s in a if s.family == "bwd_dq_dk_dv")


@pytest.mark.parametrize("body, key", [
    ({"variant": "fwd", "trait_config": {"colour": {"values": ["red"]}}}, "trait_config.colour"),
    ({"variant": "fwd", "trait_config": {"data_type": {"values": ["fp64"]}}}, "trait_config.data_type"),
    ({"variant": "fwd", "trait_config": {"data_type": {"value": ["fp16"]}}}, "trait_config.data_type"),
    ({"variant": "fwd", "trait_config": {"lse": {"values": ["maybe"]}}}, "trait_config.lse"),
    ({"variant": "fwd", "trait_config": {"hdim_q": {"values": "128"}}}, "trait_config.hdim_q"),
    ({"variant": "forward"}, "variant"),
    ({"variant": "fwd", "arch": "gfx1030"}, "arch"),
    ({"variant": "fwd", "receipt": 7}, "receipt"),
    ({"variant": "fwd", "extra": 1}, "extra"),
])
def test_sweep_errors_name_file_and_key(tmp_path, body, key):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert str(path) in str(err.value) and key in str(err.value)


def test_sweep_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_sweep(tmp_path / "missing.json")
    bad = tmp_path / "bad.toml"
    bad.write_text("variant = \n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_sweep(bad)
    other = tmp_path / "c.yaml"
    other.write_text("variant: fwd\n")
    with pytest.raises(ConfigError, match="json or .toml"):
        load_sweep(other)
    with pytest.raises(ConfigError, match="no arch"):
        parse_sweep({"variant": "fwd"}, "inline").enumerate()


def test_per_arch_codegen_facts_come_from_the_arch_plugins():
    """Which pipelines and factories CK's FMHA codegen uses on an arch are its ArchSpec's
    (``extras["fmha"]["ck_codegen"]``), not tables in the op plugin (issue #30)."""
    from ck_core.plugins import get_manager
    from ck_fmha.codegen import ck_facts

    assert not hasattr(ck_facts, "ARCH_PIPELINES") and not hasattr(ck_facts, "FACTORY")
    for arch in ARCHES:
        facts = get_manager().arch(arch).extras["fmha"]["ck_codegen"]
        assert ck_facts.arch_pipelines(arch) == tuple(facts["pipelines"])
        assert ck_facts.factory("fwd", arch) == facts["factories"]["fwd"]
    assert ck_facts.factory("fwd", "sm90") is None and ck_facts.arch_pipelines("no_such_arch") == ()
