"""Meta-parameters of the Triton GEMM kernels, as plain data.

A :class:`GemmConfig` is one point of :data:`CONFIG_SPACE`.  Its ``name`` is a
stable token string (``tri_tma_persistent_ws_m128n256k64_g8_w8_s3_sk1``, with an
``_e2``/``_e4`` suffix when the epilogue is subtiled) that :meth:`GemmConfig.from_name`
parses back, so it can key registries and tables.
:func:`smem_bytes` estimates the shared memory (LDS) a config needs, so that a
caller can prune by an arch's limit before compiling anything.
"""
from __future__ import annotations

import functools
import itertools
import re
from dataclasses import asdict, dataclass, replace
from typing import Iterator, Mapping

from ck_core.errors import InvalidProblem

#: every variant the kernels implement
#:  plain              pointer loads, one program per output tile (Ampere-style cp.async on sm90)
#:  persistent         pointer loads, a grid of #SMs programs looping over tiles
#:  tma                host tensor descriptors (TMA bulk copies on sm90), one program per tile
#:  tma_ws             tma + warp specialisation of the K loop (producer / consumer warps)
#:  tma_persistent     tensor descriptors + persistent tile loop
#:  tma_persistent_ws  tma_persistent + warp specialisation of the flattened tile loop
#:  tma_cs             tma whose C tile also leaves through a descriptor (TMA store)
#:  tma_persistent_cs  tma_persistent with the C descriptor store
#:  streamk           pointer loads, a grid of #SMs programs: whole waves of tiles data-parallel,
#:                     the rest cut into equal shares of K steps (stream-K), partial tiles summed
#:                     in the same launch (a workspace and per-tile counters)
#:  tma_streamk        streamk with tensor-descriptor loads
#: The ``_cs`` variants may split their epilogue along N (``epi_subtile`` 2 or 4): each
#: slice is converted and stored on its own, so the staging buffer is a slice, not the tile.
VARIANTS = ("plain", "persistent", "tma", "tma_ws", "tma_persistent", "tma_persistent_ws",
            "tma_cs", "tma_persistent_cs", "streamk", "tma_streamk")
#: variants that read through tensor descriptors; on AMD targets (no TMA) Triton lowers
#: them to ordinary loads where it can, see kernel_for's docstring for what compiles where
TMA_VARIANTS = ("tma", "tma_ws", "tma_persistent", "tma_persistent_ws", "tma_cs", "tma_persistent_cs",
                "tma_streamk")
#: variants that split K per problem themselves (stream-K: a grid of #SMs, split_k stays 1)
STREAMK_VARIANTS = ("streamk", "tma_streamk")
PERSISTENT_VARIANTS = ("persistent", "tma_persistent", "tma_persistent_ws", "tma_persistent_cs")
WS_VARIANTS = ("tma_ws", "tma_persistent_ws")
#: variants that write C through a tensor descriptor (row-major C, no split-K),
#: each with the twin that stores C through pointers instead
C_DESC_TWIN = {"tma_cs": "tma", "tma_persistent_cs": "tma_persistent"}
C_DESC_VARIANTS = tuple(C_DESC_TWIN)
#: variants that may split K (a persistent loop owns whole tiles)
SPLITK_VARIANTS = ("plain", "tma", "tma_ws")
#: how many N-slices the epilogue of a C_DESC variant may store the tile in
EPI_SUBTILES = (1, 2, 4)
#: a descriptor store slice must be at least this many columns wide (16 bytes of fp8)
MIN_EPI_SLICE_N = 16

#: the meta-parameter space: axis -> allowed values.  Not every combination is
#: useful; :func:`iter_configs` applies the structural rules, an arch plugin
#: prunes further (smem_bytes against its LDS size, warp size, dtypes).
CONFIG_SPACE: Mapping[str, tuple] = {
    "block_m": (16, 32, 64, 128, 256),
    "block_n": (16, 32, 64, 128, 256),
    "block_k": (16, 32, 64, 128, 256),
    "group_m": (1, 4, 8, 16),
    "num_warps": (2, 4, 8),
    "num_stages": (1, 2, 3, 4, 5, 6),
    "variant": VARIANTS,
    "split_k": (1, 2, 3, 4, 6, 8, 16),
    "epi_subtile": EPI_SUBTILES,
}

ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1, "bf8": 1, "int8": 1, "fp32": 4, "int32": 4}

_NAME_RE = re.compile(
    r"^tri_(?P<variant>[a-z_]+?)_m(?P<block_m>\d+)n(?P<block_n>\d+)k(?P<block_k>\d+)"
    r"_g(?P<group_m>\d+)_w(?P<num_warps>\d+)_s(?P<num_stages>\d+)_sk(?P<split_k>\d+)"
    r"(?:_e(?P<epi_subtile>\d+))?$")


@dataclass(frozen=True)
class GemmConfig:
    """One kernel instance's meta-parameters (tile, warps, pipeline depth, variant)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    variant: str = "plain"
    split_k: int = 1
    #: N-slices of the C descriptor store (C_DESC_VARIANTS only; 1 = the whole tile at once)
    epi_subtile: int = 1

    def __post_init__(self):
        for axis in ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages", "split_k",
                     "epi_subtile"):
            v = getattr(self, axis)
            if not isinstance(v, int) or v < 1:
                raise InvalidProblem(f"GemmConfig.{axis}={v!r}: must be a positive int")
        for axis in ("block_m", "block_n", "block_k", "num_warps"):
            v = getattr(self, axis)
            if v & (v - 1):
                raise InvalidProblem(f"GemmConfig.{axis}={v}: must be a power of two")
        if self.block_m < 16 or self.block_n < 16 or self.block_k < 16:
            raise InvalidProblem("GemmConfig: tl.dot needs block_m, block_n, block_k >= 16")
        if self.variant not in VARIANTS:
            raise InvalidProblem(f"GemmConfig.variant={self.variant!r}: use one of {', '.join(VARIANTS)}")
        if self.split_k > 1 and self.variant not in SPLITK_VARIANTS:
            raise InvalidProblem(
                f"GemmConfig: split_k={self.split_k} needs a variant in {SPLITK_VARIANTS}, "
                f"not {self.variant!r} (a persistent loop owns whole tiles)")
        if self.epi_subtile not in EPI_SUBTILES:
            raise InvalidProblem(f"GemmConfig.epi_subtile={self.epi_subtile}: use one of {EPI_SUBTILES}")
        if self.epi_subtile > 1:
            if self.variant not in C_DESC_VARIANTS:
                raise InvalidProblem(f"GemmConfig: epi_subtile={self.epi_subtile} needs a variant in "
                                     f"{C_DESC_VARIANTS}, not {self.variant!r}")
            if self.block_n // self.epi_subtile < MIN_EPI_SLICE_N:
                raise InvalidProblem(f"GemmConfig: block_n={self.block_n} / epi_subtile={self.epi_subtile} "
                                     f"leaves slices narrower than {MIN_EPI_SLICE_N} columns")

    @property
    def name(self) -> str:
        # the subtile suffix appears only when used, so every older name stays valid
        sub = f"_e{self.epi_subtile}" if self.epi_subtile > 1 else ""
        return (f"tri_{self.variant}_m{self.block_m}n{self.block_n}k{self.block_k}"
                f"_g{self.group_m}_w{self.num_warps}_s{self.num_stages}_sk{self.split_k}{sub}")

    @classmethod
    def from_name(cls, name: str) -> "GemmConfig":
        m = _NAME_RE.match(name)
        if not m:
            raise InvalidProblem(f"not a Triton GEMM config name: {name!r} "
                                 "(expected e.g. tri_plain_m128n128k64_g8_w4_s3_sk1)")
        d = m.groupdict()
        return cls(variant=d.pop("variant"), **{k: int(v) for k, v in d.items() if v is not None})

    @classmethod
    def from_dict(cls, d: Mapping) -> "GemmConfig":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        unknown = set(d) - set(known)
        if unknown:
            raise InvalidProblem(f"GemmConfig: unknown keys {sorted(unknown)}")
        return cls(**known)

    def to_dict(self) -> dict:
        return asdict(self)

    def evolve(self, **changes) -> "GemmConfig":
        return replace(self, **changes)

    @property
    def is_tma(self) -> bool:
        return self.variant in TMA_VARIANTS

    @property
    def is_persistent(self) -> bool:
        return self.variant in PERSISTENT_VARIANTS

    @property
    def warp_specialize(self) -> bool:
        return self.variant in WS_VARIANTS

    @property
    def streamk(self) -> bool:
        return self.variant in STREAMK_VARIANTS

    @property
    def c_desc(self) -> bool:
        """True when C is written through a tensor descriptor (TMA store)."""
        return self.variant in C_DESC_VARIANTS


def as_config(config) -> GemmConfig:
    """Accept a GemmConfig, a dict of its fields, or its name."""
    if isinstance(config, GemmConfig):
        return config
    if isinstance(config, str):
        return GemmConfig.from_name(config)
    if isinstance(config, Mapping):
        return GemmConfig.from_dict(config)
    raise InvalidProblem(f"config must be a GemmConfig, dict or name, not {type(config).__name__}")


def smem_bytes(config, dtype: str = "fp16", out_dtype: str | None = None, num_d: int | None = None) -> int:
    """Upper estimate of the shared memory (bytes) one program of ``config`` uses.

    Model, fitted to ``CompiledKernel.metadata.shared`` of triton 3.6 on sm90
    (48 configs of the six pointer-store variants, ~80 more of the ``_cs`` ones)
    and checked on gfx90a/gfx942/gfx950/gfx1100/gfx1201 by the tests (compiled
    <= estimate everywhere):

    * pipeline = num_stages x (A tile + B tile): sm90 keeps exactly that many
      buffers once the K loop is software-pipelined (fewer when it is not;
      AMD's stream pipeliner keeps num_stages - 1 or fewer);
    * persistent variants add an epilogue staging buffer that cannot alias
      the live ring: 16 KiB up to 128x128 tiles, half the C tile beyond
      (32 KiB + 32 B seen for a 128x256 tma_persistent, 4 stages);
    * warp-specialised variants add the accumulator hand-off between
      partitions: <= max(block_m*block_n, 16 KiB) seen;
    * C-descriptor (``_cs``) variants stage one epilogue slice of C
      (block_m x block_n/epi_subtile in the output dtype) for the TMA store:
      persistent ones beside the ring, + 4 KiB when D tensors are fused
      (their layout conversion; seen 2-4 KiB; ``num_d=None``, unknown,
      counts it, ``num_d=0`` does not); non-persistent ones reuse the
      drained ring, except (sometimes) an unsliced tile;
    * the non-persistent epilogue's layout conversion reuses the ring, so it
      only counts when larger (block_m*block_n*4);
    * TMA variants: + 1 KiB for mbarriers (seen: 16-120 bytes).

    Exact for plain/tma on sm90 up to the barriers, over by at most one stage
    or a few KiB elsewhere: safe for pruning against an arch's limit.
    """
    cfg = as_config(config)
    eb = ELEMENT_BYTES.get(dtype)
    if eb is None:
        raise InvalidProblem(f"smem_bytes: unknown dtype {dtype!r}")
    if out_dtype is not None and out_dtype not in ELEMENT_BYTES:
        raise InvalidProblem(f"smem_bytes: unknown out_dtype {out_dtype!r}")
    # C's element size: the launcher's default output is 4 bytes for int8/fp32, else 2
    out_eb = ELEMENT_BYTES[out_dtype] if out_dtype else (4 if dtype in ("int8", "int32", "fp32") else 2)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    pipeline = max(cfg.num_stages, 1) * (bm + bn) * bk * eb
    extra = 0
    if cfg.warp_specialize:
        extra = max(bm * bn, 16384)
    elif cfg.c_desc:
        stage = bm * (bn // cfg.epi_subtile) * out_eb
        if cfg.is_persistent:
            extra = stage + (4096 if num_d is None or num_d > 0 else 0)
        else:
            extra = stage if cfg.epi_subtile == 1 else 0
    elif cfg.is_persistent:
        extra = max(min(bm * bn * 4, 16384), bm * bn * 2 // 2 + 64)
    barriers = 1024 if cfg.is_tma else 0
    return max(pipeline + extra, bm * bn * 4) + barriers


def iter_configs(*, variants=VARIANTS, max_smem: int | None = None, dtype: str = "fp16",
                 warp_size: int = 32, **axes) -> Iterator[GemmConfig]:
    """Every structurally legal config of CONFIG_SPACE (optionally restricted per axis).

    ``axes`` overrides an axis' values, e.g. ``iter_configs(block_m=(64, 128))``.
    Rules: split_k only for SPLITK_VARIANTS; epi_subtile > 1 only for
    C_DESC_VARIANTS with slices >= MIN_EPI_SLICE_N wide; warp-specialised variants only
    with num_warps=4 and block_m >= 128; a tile must give each thread at
    least one element of work per 16-wide MMA fragment (block_m*block_n >=
    num_warps*warp_size*8); ``max_smem`` drops configs over the limit.
    """
    space = dict(CONFIG_SPACE)
    space["variant"] = tuple(variants)
    for k, v in axes.items():
        if k not in space:
            raise InvalidProblem(f"iter_configs: unknown axis {k!r}; axes are {', '.join(space)}")
        space[k] = tuple(v)
    keys = list(space)
    for values in itertools.product(*(space[k] for k in keys)):
        d = dict(zip(keys, values))
        if d["split_k"] > 1 and d["variant"] not in SPLITK_VARIANTS:
            continue
        if d["epi_subtile"] > 1 and (d["variant"] not in C_DESC_VARIANTS
                                     or d["block_n"] // d["epi_subtile"] < MIN_EPI_SLICE_N):
            continue
        if d["block_m"] * d["block_n"] < d["num_warps"] * warp_size * 8:
            continue
        if d["variant"] in WS_VARIANTS and (d["num_warps"] != 4 or d["block_m"] < 128):
            # triton 3.6 on sm90 warp-specialises only at num_warps=4, and its
            # compiler fails on block_m=64 x block_n=256 specialised tiles
            continue
        cfg = GemmConfig(**d)
        if max_smem is not None and smem_bytes(cfg, dtype) > max_smem:
            continue
        yield cfg


#: Triton pipelining depth per CK pipeline when a key sets no explicit stages
DEFAULT_STAGES = {"mem": 2, "compv3": 2, "compv4": 3}


@functools.lru_cache(maxsize=None)
def config_of_algorithm(a):
    """The Triton config of a GEMM algorithm record (``ck_gemm.keys.GemmAlgorithm``)."""
    return GemmConfig(block_m=a.tile_m, block_n=a.tile_n, block_k=a.tile_k, group_m=a.group_m,
                      num_warps=a.num_warps, num_stages=a.stages or DEFAULT_STAGES.get(a.pipeline, 3),
                      variant="plain" if a.variant == "tile" else a.variant, split_k=a.split_k,
                      epi_subtile=a.epi_subtile)
