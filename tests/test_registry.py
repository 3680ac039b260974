import json

import pytest

from ck_core import ConfigError, KernelKey, MissingKernel, Registry

pytest.importorskip("ck_gemm")
from ck_gemm import GemmProblem  # noqa: E402


@pytest.fixture
def reg(ck_manager, fake_arch):
    return Registry.from_enumeration("gemm", fake_arch.name)


def test_enumeration_nonempty_and_unique(reg):
    names = [k.name for k in reg]
    assert len(names) > 50 and len(set(names)) == len(names)


def test_every_name_round_trips(reg):
    for key in reg:
        assert KernelKey.from_name(key.name) == key


def test_json_round_trip(reg, tmp_path):
    path = reg.export_json(tmp_path / "r.json")
    back = Registry.import_json(path)
    assert back.keys() == reg.keys() and back.arch == reg.arch
    rec = json.loads(path.read_text())["kernels"][0]
    assert KernelKey.from_dict(rec).name == rec["name"]


def test_edited_json_is_detected(reg, tmp_path):
    data = reg.to_dict()
    data["kernels"][0]["algorithm"]["tile_m"] += 1
    with pytest.raises(MissingKernel, match="disagrees"):
        Registry.from_dict(data)


def test_filter_merge_and_side_by_side(reg, fake_arch):
    small = reg.filter("c.tile_m == 64 and c.dtype == 'fp16'")
    big = reg.filter(lambda f: f["tile_m"] == 128 and f["dtype"] == "fp16")
    assert small and big and all(k.algorithm.tile_m == 64 for k in small)
    both = small.merge(big)
    assert len(both) == len(small) + len(big)
    assert len(reg) > len(both)  # the original is untouched


def test_arch_mismatch_rejected(reg):
    key = next(iter(reg)).with_arch("other")
    with pytest.raises(ConfigError, match="one registry per arch"):
        reg.add(key)


def test_candidates_respect_padding(reg):
    p = GemmProblem(m=100, n=64, k=64, dtype="fp16", layout="rcr")
    cands = reg.candidates(p)
    assert cands and all(k.algorithm.pad_m for k in cands)
    p2 = GemmProblem(m=128, n=128, k=128, dtype="fp16", layout="rcr")
    assert any(not k.algorithm.pad_m for k in reg.candidates(p2))


def test_get_unknown_name(reg):
    with pytest.raises(MissingKernel, match="ck list"):
        reg.get("gemm_nope.fake64.numpy")


def test_bad_registry_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Registry.import_json(p)
    p.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ConfigError, match="not a registry file"):
        Registry.import_json(p)


def test_why_not_gives_distinct_reasons_rarest_first(reg):
    """A problem only a few keys miss narrowly: the message leads with the rare reasons and counts
    the keys behind each, instead of five copies of the most common one."""
    import re

    fp16 = reg.filter("c.dtype == 'fp16'")
    p = GemmProblem(m=100, n=100, k=100, dtype="bf16", layout="rcr")
    why = fp16.merge(reg.filter("c.dtype == 'bf16' and c.layout != 'rcr'")).why_not(p, limit=10)
    assert why
    reasons = [w.split(": ", 1)[1] for w in why]
    counts = [1 + int(m.group(1)) if (m := re.search(r"\(and (\d+) more keys\)$", r)) else 1 for r in reasons]
    bare = [re.sub(r" \(and \d+ more keys\)$", "", r) for r in reasons]
    assert len(set(bare)) == len(bare)                 # distinct
    assert counts == sorted(counts)                    # rarest first
    assert sum(counts) <= len(fp16) + len(reg)
