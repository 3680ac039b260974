"""The conv kernel space per arch equals the recorded one (data/enumeration.json, recorded before
CK's tile tables moved out of the code into data files): moving facts between files must not add,
drop or rename a key.

``python plugins/conv/tests/test_enumeration_parity.py > plugins/conv/tests/data/enumeration.json``
rewrites the record (only when the space is meant to change).
"""
import hashlib
import json
import sys
from pathlib import Path

import pytest

RECORD_FILE = Path(__file__).parent / "data" / "enumeration.json"
ARCHS = ("sm90", "gfx942", "gfx90a", "gfx1100")
#: (name, backend, options) of the spaces whose sorted names are digested (small enough to list)
DIGESTED = (
    ("fwd_fp16_2d", "numpy", {"directions": ["forward"], "dtypes": ["fp16"], "ndims": [2]}),
    ("bwd_data_bf16_3d", "numpy", {"directions": ["bwd_data"], "dtypes": ["bf16"], "ndims": [3]}),
    ("bwd_weight_fp32_1d", "numpy", {"directions": ["bwd_weight"], "dtypes": ["fp32"], "ndims": [1]}),
    ("triton_fwd_fp16_2d_filter3x3", "triton", {"directions": ["forward"], "dtypes": ["fp16"], "ndims": [2],
                                                "specializations": ["filter3x3", "depthwise"]}),
    ("triton_bwd_weight_bf16_2d_1x1", "triton", {"directions": ["bwd_weight"], "dtypes": ["bf16"], "ndims": [2],
                                                 "specializations": ["filter1x1_pad0"]}),
)


def digest(names) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def record(archs=ARCHS) -> dict:
    from ck_core.plugins import get_manager
    from ck_conv.keyspace import key_space

    mgr = get_manager()
    out = {}
    for name in archs:
        arch = mgr.arch(name)
        row = {f"count_{b}": key_space(arch, b, {}).count() for b in ("numpy", "triton")}
        for label, backend, opts in DIGESTED:
            names = [k.name for k in key_space(arch, backend, opts)]
            row[label] = [len(names), digest(names)]
        out[name] = row
    return out


@pytest.fixture(scope="module")
def current():
    from ck_core.plugins import get_manager

    have = set(get_manager().archs())
    missing = [a for a in ARCHS if a not in have]
    if missing:
        pytest.skip(f"arch plugins not installed: {missing}")
    return record()


@pytest.mark.parametrize("arch", ARCHS)
def test_space_equals_the_record(current, arch):
    assert current[arch] == json.loads(RECORD_FILE.read_text())[arch]


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


def test_an_arch_replaces_the_generic_tables_field_by_field():
    import attrs

    from ck_core.testing import make_fake_arch
    from ck_conv.keys import config_of, legal
    from ck_conv.keys import conv_facts
    from ck_conv.keyspace import key_space

    base = make_fake_arch("fake_conv")
    generic = conv_facts()
    assert conv_facts(base) is generic   # nothing declared: the data file's tables
    def declaring(**conv):
        return attrs.evolve(base, extras={**base.extras, "conv": conv})

    own = declaring(tiles=[[64, 64, 32]], depthwise_tiles=[[32, 64, 1]], max_block_threads=256)
    facts = conv_facts(own)
    assert facts["tiles"] == ((64, 64, 32),) and facts["depthwise_tiles"] == ((32, 64, 1),)
    assert facts["max_block_threads"] == 256 and facts["waves"] == generic["waves"]
    opts = {"directions": ["forward"], "dtypes": ["fp16"], "ndims": [2]}
    assert {config_of(k).tile for k in key_space(own, "numpy", opts)} == {(64, 64, 32), (32, 64, 1)}
    # 128 threads: two waves of 64 lanes, and every wave layout of the fake arch has four; legal()
    # gives the same reason for a key of the generic space
    small = declaring(max_block_threads=128)
    assert {config_of(k).specialization for k in key_space(small, "numpy", opts)} == {"depthwise"}
    four = next(k for k in key_space(base, "numpy", opts) if config_of(k).specialization != "depthwise")
    assert legal(four, base) is None and "exceed 128 threads" in legal(four, small)
