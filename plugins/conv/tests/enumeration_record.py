"""Record of the conv kernel space per arch: counts and digests of the sorted key names.

``python plugins/conv/tests/enumeration_record.py > plugins/conv/tests/data/enumeration.json``
rewrites the record (only when the space is meant to change); ``test_enumeration_parity.py``
checks the installed plugins against it.
"""
import hashlib
import json
import sys

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
    from ck_conv.space import key_space

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


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
