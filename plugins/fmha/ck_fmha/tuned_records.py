"""The records of FMHA's tuned tables, checked once per load (``ck_fmha.heuristics.tuned`` passes
:data:`CHECKS` to :func:`ck_core.tuned_data.table`), so a bad user override is refused by name."""
from __future__ import annotations

from .backends.triton.configs import KVSPLIT, VARIANTS, TritonFmhaConfig, valid_dchunk

SEQ_BUCKETS = (512, 1024, 4096, 16384)

# -- the records of each table, checked where they are read ------------------------------------

_FIELDS = frozenset(TritonFmhaConfig.__dataclass_fields__)


def _int(v, what: str, lo: int, hi: int, pow2: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi or (pow2 and v & (v - 1)):
        raise ValueError(f"{what} {v!r:.40} is not {'a power of two' if pow2 else 'an integer'} in {lo}..{hi}")
    return v


#: the backward's dK/dV kernel also comes as ``kvsplit`` (keys.KVSPLIT: two programs per key block)
BWD_VARIANTS = VARIANTS + (KVSPLIT,)


def check_config(v, variants=VARIANTS) -> None:
    """A TritonFmhaConfig record: known fields, power-of-two tiles, sane warps / stages, a known variant."""
    if not isinstance(v, dict):
        raise ValueError(f"a configuration is an object of {', '.join(sorted(_FIELDS))}, not {type(v).__name__}")
    unknown = sorted(str(k)[:30] for k in v if k not in _FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    for f in ("BLOCK_M", "BLOCK_N"):
        _int(v.get(f, 16), f, 16, 512, pow2=True)
    _int(v.get("num_warps", 4), "num_warps", 1, 32)
    _int(v.get("num_stages", 1), "num_stages", 1, 8)
    if v.get("variant", "ptr") not in variants:
        raise ValueError(f"variant {v.get('variant')!r:.40} is not one of {', '.join(variants)}")
    if not valid_dchunk(_int(v.get("DCHUNK", 0), "DCHUNK", 0, 256)):
        raise ValueError(f"DCHUNK {v['DCHUNK']} is not 0 or a power of two in 16..256")
    _int(v.get("GSPLIT", 0), "GSPLIT", 0, 1024)


def _check_hdim_key(key) -> None:
    _int(key[0], "head dim", 1, 1024)
    for k in key[1:2]:
        if not isinstance(k, bool):
            raise ValueError(f"causal {k!r:.20} is not true/false")
    for k in key[2:3]:
        if k not in SEQ_BUCKETS:
            raise ValueError(f"seqlen bucket {k!r:.20} is not one of {SEQ_BUCKETS}")


def _check_fwd(key, v) -> None:
    _check_hdim_key(key)
    check_config(v)


def _check_bwd(key, v) -> None:
    _check_hdim_key(key)
    if not isinstance(v, dict) or set(v) != {"dkdv", "dq"}:
        raise ValueError("a backward entry is {\"dkdv\": config, \"dq\": config}")
    check_config(v["dkdv"], BWD_VARIANTS)
    check_config(v["dq"], BWD_VARIANTS)


def _check_tile(key, v) -> None:
    _check_hdim_key(key)
    if not isinstance(v, dict) or set(v) != {"BLOCK", "STAGES", "persistent"}:
        raise ValueError("a Gluon tile is {\"BLOCK\": n, \"STAGES\": n, \"persistent\": bool}")
    _int(v["BLOCK"], "BLOCK", 16, 256, pow2=True)
    _int(v["STAGES"], "STAGES", 1, 8)
    if not isinstance(v["persistent"], bool):
        raise ValueError("persistent is not true/false")


def _check_gsplit(key, v) -> None:
    if not isinstance(v, dict) or not set(v) <= {"waves", "min_rows", "gluon_waves"}:
        raise ValueError("a group-split rule is {\"waves\": n, \"min_rows\": n, \"gluon_waves\": n}")
    for f, x in v.items():
        _int(x, f, 0, 1 << 30)


#: table name -> the check of its entries
CHECKS = {**dict.fromkeys(("fwd_defaults", "fwd_dchunk", "fwd_tuned", "fwd_gluon", "fwd_fp8", "splitkv_defaults"),
                          _check_fwd),
          **dict.fromkeys(("bwd_tuned", "bwd_defaults"), _check_bwd),
          **dict.fromkeys(("bwd_gluon_dq", "bwd_gluon_dkdv", "bwd_gluon_fused", "gluon_dq_tiles", "gluon_dkdv_tiles",
                           "gluon_fused_tiles"), _check_tile),
          "bwd_gsplit": _check_gsplit}
