"""Kernel keys of RMSNorm: a Signature (what: the dtype) and an Algorithm (how: the tile).

A key's name is its identity: ``rmsnorm_<dtype>_r<rows>x<cols>[_pad]``, then ``.<arch>.<backend>``
(added by the core). ``parse_name`` reads it back; ``from_fields`` checks JSON records field by field.
"""
from __future__ import annotations

import re
from typing import Optional

import attrs

from ck_core.errors import MissingKernel
from ck_core.key import RecordSchema

from .problem import DTYPES


@attrs.frozen
class RmsNormAlgorithm:
    block_rows: int   # rows one program normalises
    block_cols: int   # columns one step of a program reads (the vector width of the loop)
    pad: bool         # masks the last step, so any cols runs; unpadded kernels need cols % block_cols == 0


@attrs.frozen
class RmsNormSignature:
    dtype: str

    def name_body(self, alg: RmsNormAlgorithm) -> str:
        """The name without arch and backend (the signature names itself: no manager needed)."""
        return f"rmsnorm_{self.dtype}_r{alg.block_rows}x{alg.block_cols}{'_pad' if alg.pad else ''}"


_NAME = re.compile(r"^rmsnorm_(?P<dtype>[a-z0-9]+)_r(?P<r>\d+)x(?P<c>\d+)(?P<pad>_pad)?$")
_SIGNATURE = RecordSchema(RmsNormSignature, what="rmsnorm signature", choices={"dtype": DTYPES})
_ALGORITHM = RecordSchema(RmsNormAlgorithm, what="rmsnorm algorithm",
                          bounds={"block_rows": (1, 64), "block_cols": (1, 1 << 16)})


def format_name(sig: RmsNormSignature, alg: RmsNormAlgorithm) -> str:
    return sig.name_body(alg)


def parse_name(body: str):
    m = _NAME.match(body)
    if not m or m["dtype"] not in DTYPES:
        raise MissingKernel(f"{body!r} is not an rmsnorm kernel name (rmsnorm_<dtype>_r<R>x<C>[_pad])")
    return from_fields({"dtype": m["dtype"]},
                       {"block_rows": int(m["r"]), "block_cols": int(m["c"]), "pad": bool(m["pad"])})


def from_fields(sig: dict, alg: dict):
    """(signature, algorithm) of untrusted field dicts (a registry JSON): every field checked."""
    return _SIGNATURE(sig), _ALGORITHM(alg)


def supports(key, problem) -> Optional[str]:
    """None when ``key`` computes ``problem``, else why not (the Dispatcher's candidate filter)."""
    s, a = key.signature, key.algorithm
    if s.dtype != problem.dtype:
        return f"kernel is {s.dtype}, problem {problem.dtype}"
    if problem.cols % a.block_cols and not a.pad:
        return f"cols={problem.cols} is not a multiple of {a.block_cols} and the kernel does not pad"
    return None
