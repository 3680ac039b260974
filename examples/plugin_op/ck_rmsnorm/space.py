"""Which RMSNorm keys exist on an arch: the product of the tile tables, culled by the arch's facts."""
from __future__ import annotations

import logging
from typing import Optional

from ck_core.dtypes import ELEMENT_BYTES
from ck_core.errors import ConfigError
from ck_core.key import KernelKey

from .keys import RmsNormAlgorithm, RmsNormSignature
from .problem import DTYPES

log = logging.getLogger(__name__)

BLOCK_ROWS = (1, 2, 4, 8)
BLOCK_COLS = (64, 128, 256, 512, 1024, 2048)
#: the enumeration options and their help (`ck list rmsnorm --help`)
OPTIONS = {"dtypes": "element dtypes, e.g. fp16,bf16 (default: those of fp16, bf16, fp32 the arch runs)",
           "block_cols": "columns per step, e.g. 256,1024 (default: 64 to 2048)"}


def legal(key, arch) -> Optional[str]:
    """Why the enumeration rules reject ``key`` on ``arch`` (None: legal). A tile's rows stay in
    the arch's shared memory (LDS), and a step covers at least one element per lane of a warp."""
    a = key.algorithm
    tile_bytes = a.block_rows * a.block_cols * ELEMENT_BYTES[key.signature.dtype]
    if tile_bytes > arch.lds_bytes // 4:
        return f"a {a.block_rows}x{a.block_cols} tile needs {tile_bytes} bytes, over a quarter of {arch.name}'s LDS"
    if a.block_cols < arch.warp_size:
        return f"block_cols {a.block_cols} < warp size {arch.warp_size}"
    if key.signature.dtype not in arch.dtypes:
        return f"{arch.name} has no {key.signature.dtype}"
    return None


def enumerate_keys(arch, backend: str, options: dict) -> list:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown rmsnorm option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    as_list = lambda v: [v] if isinstance(v, (str, int)) else list(v)
    dtypes = as_list(options.get("dtypes") or [d for d in DTYPES if d in arch.dtypes])
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ConfigError(f"rmsnorm option dtypes: unknown {bad}; use {', '.join(DTYPES)}")
    block_cols = [int(c) for c in as_list(options.get("block_cols") or BLOCK_COLS)]
    out = []
    for dtype in dtypes:
        for r in BLOCK_ROWS:
            for c in block_cols:
                for pad in (False, True):
                    key = KernelKey("rmsnorm", RmsNormSignature(dtype), RmsNormAlgorithm(r, c, pad),
                                    arch.name, backend)
                    why = legal(key, arch)
                    if why:
                        log.debug("culled %s: %s", key.name, why)
                        continue
                    out.append(key)
    return out


def problem_options(problem) -> dict:
    """The part of the space that can run ``problem`` (ck run / ck demo enumerate only that)."""
    return {"dtypes": (problem.dtype,)}
