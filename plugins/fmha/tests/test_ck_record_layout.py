"""`ck import` of CK FMHA records whose tuples or named strings do not fit their family: a ConfigError
naming the field (never an IndexError from the name builders), from a record and from a name."""
import json

import pytest

from ck_core import CkError, KernelKey
from ck_core.cli import main as ck_main
from ck_fmha.keys import SPEC_LENGTHS


@pytest.fixture(scope="module")
def records():
    """One record of each CK family (gfx950), as `ck export` writes them."""
    from ck_fmha.codegen.enumerate import enumerate_kernels

    out = {}
    for spec in enumerate_kernels("gfx950", 0, None):
        if spec.family not in out:
            out[spec.family] = {"op": "fmha", "arch": "gfx950", "backend": "numpy",
                                "signature": spec.to_dict(), "algorithm": {}}
    assert set(out) == set(SPEC_LENGTHS)
    return out


CASES = [(fam, field, value) for fam in ("fwd", "bwd_dq_dk_dv", "fwd_appendkv", "bwd_convert_dq")
         for field, value in (("tile", []), ("tile", [16]), ("warps", []), ("warp_tile", []), ("warps", [1] * 7))] \
    + [(fam, field, "") for fam in ("fwd", "fwd_splitkv", "batch_prefill") for field in ("vlayout", "mask", "pipeline",
                                                                                          "bias", "mode")]


@pytest.mark.parametrize("family,field,value", CASES, ids=[f"{f}-{k}-{v!r}" for f, k, v in CASES])
def test_records_that_do_not_fit_their_family(records, family, field, value):
    rec = json.loads(json.dumps(records[family]))
    rec["signature"][field] = value
    want = SPEC_LENGTHS[family][("tile", "warps", "warp_tile").index(field)] if field in ("tile", "warps", "warp_tile") \
        else None
    if want is not None and len(value) == want:
        pytest.skip("the family uses this length")
    if want == 0 and field != "tile" and not value:
        pytest.skip("the family has no such tuple")
    with pytest.raises(CkError, match=field):
        KernelKey.from_dict(rec)


def test_every_family_record_round_trips(records):
    for fam, rec in records.items():
        key = KernelKey.from_dict(rec)
        assert KernelKey.from_name(key.name) == key


def test_ck_import_of_an_empty_tile(records, tmp_path, capsys):
    rec = json.loads(json.dumps(records["fwd"]))
    rec["signature"]["tile"] = []
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"format": "ck-dispatcher.registry/1", "name": "x", "arch": "gfx950", "kernels": [rec]}))
    assert ck_main(["import", str(p)]) == 2
    err = capsys.readouterr().err
    assert "'tile' must hold 6 integers" in err and "internal error" not in err


def test_names_missing_a_field_are_refused(records):
    name = KernelKey.from_dict(records["fwd"]).name
    for part in ("_vlayout-row", "_mask-no"):
        if part in name:
            with pytest.raises(CkError):
                KernelKey.from_name(name.replace(part, ""))
    tile = next(t for t in name.split("_") if t.startswith("tile-"))
    with pytest.raises(CkError, match="tile"):
        KernelKey.from_name(name.replace("_" + tile, ""))
