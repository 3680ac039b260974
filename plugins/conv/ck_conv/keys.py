"""The kernel keys of grouped convolution: configs, names, legality.

A :class:`ConvKernelConfig` is one kernel: what it computes (direction, dtype,
layouts, spatial rank, specialisation) and how (implicit-GEMM block tile, waves,
warp tile, pipeline, scheduler, vector sizes, padding).  Its name is its
identity and parses back::

    conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x128x32_2x2x1_32x32x16_default
    conv_bwd_weight_bf16_ndhwgc_gkzyxc_ndhwgk_3d_mem_intrawave_64x64x64_2x2x1_16x16x16_filter1x1_pad0_vec8_8_8

Optional suffixes appear only when not default: ``_vec{a}_{b}_{c}`` (default
4/8/8, CK's) and ``_pad{m}{n}{k}`` (default all padded), then the Triton
realisation's knobs (see :class:`ConvKernelConfig`): ``_st{n}`` (explicit
software-pipeline depth), ``_relaxed`` / ``_twostage`` / ``_fixup`` / ``_atomicfix``
(how a split reduction is summed, or ``_streamk``), ``_gm{n}`` (groups merged per program) and ``_tapmask``
(forward, bwd_data, bwd_weight: per-row tap-validity bits, so a step's row mask
is a shift and an and) and ``_flat`` (depthwise forward / bwd_data: rows x a flat
(W, G) span per program, see :func:`ck_conv.backends.triton.kernels.dw_flat_kernel`;
forward / bwd_weight of the other specialisations: one im2col GEMM over the flattened
(tap, channel) axis j = tap*C + c, for few channels per group such as RGB stems, see
:func:`ck_conv.backends.triton.kernels.conv_bwd_weight_flat_kernel`) and
``_rows`` / ``_rows_wexp`` (depthwise forward, stride 1, dilation 1 along H and W:
RH output rows x a flat (W, G) span per program, each input row loaded once per
filter column and reused for every output row it feeds; ``_wexp`` reads the
weights from a host-expanded [taps, Wo*G] table instead of gathering them by
channel, see :mod:`ck_conv.backends.triton.dw_codegen`).

Legality follows CK's grouped-conv dispatcher rules (``grouped_config_rules``):
block tile = waves x warp tile, whole vectors per lane, the block's thread limit,
and backward kernels on the compv3 and mem pipelines only.  Which tiles, waves,
warp tiles and how much LDS exist is data: the ArchSpec's, else the generic
tables that :func:`conv_facts` reads (``space.json``) (the space is enumerated in
:mod:`ck_conv.space`, ranked in :mod:`ck_conv.heuristics`).
"""
from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import attrs

from ck_core.errors import ConfigError, InvalidProblem, MissingKernel
from ck_core.key import KernelKey, RecordSchema

from .geometry import split_plan  # the launch's own arithmetic: the name says what runs
from .problem import DIRECTIONS, DTYPES, LAYOUT_FAMILIES, ConvProblem

#: the space's generic tables (tiles, waves, realisation axes); an arch's ``extras["conv"]`` overrides
FACTS_FILE = Path(__file__).resolve().parent / "space.json"


def as_tuples(x):
    if isinstance(x, dict):
        return {k: as_tuples(v) for k, v in x.items()}
    return tuple(as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


@functools.lru_cache(maxsize=1)
def _generic() -> dict:
    data = json.loads(FACTS_FILE.read_text())
    return {**as_tuples(data["arch"]), **as_tuples(data["kernels"]), "triton": as_tuples(data["triton"])}


def conv_facts(arch=None) -> dict:
    """The conv space's tables: ``tiles``, ``waves``, ``depthwise_tiles``, ``max_block_threads``
    (arch facts: ``arch.extras["conv"]`` where it has the field, else the generic one),
    ``rows_rh`` (the row-reuse kernel's output rows) and ``triton`` (the realisation
    families' axes).  Plain tuples and dicts, shared: do not change them."""
    gen = _generic()
    own = dict(getattr(arch, "extras", {}).get("conv", {})) if arch is not None else {}
    if not own:
        return gen
    return {**gen, **{k: as_tuples(v) for k, v in own.items() if k in ("tiles", "waves", "depthwise_tiles",
                                                                      "max_block_threads")}}

DIR_TOKEN = {"forward": "fwd", "bwd_data": "bwd_data", "bwd_weight": "bwd_weight"}
TOKEN_DIR = {v: k for k, v in DIR_TOKEN.items()}
PIPELINES = ("mem", "compv3", "compv4")
#: LDS buffers a pipeline holds (compv4 double-buffers; CK's DoubleSmemBuffer)
PIPELINE_LDS_BUFFERS = {"mem": 1, "compv3": 1, "compv4": 2}
#: Triton software-pipelining depth we give each CK pipeline
PIPELINE_STAGES = {"mem": 2, "compv3": 3, "compv4": 4}
PIPELINE_STAGES_BWD = {"mem": 3, "compv3": 5, "compv4": 5}
SCHEDULERS = ("intrawave", "interwave")
SPECIALIZATIONS = ("default", "filter1x1_stride1_pad0", "filter1x1_pad0", "filter3x3", "depthwise")
#: how the programs of a split reduction combine their partial sums: ``atomic``
#: fp32 atomics into a zeroed workspace, then a cast (the original path; Triton's
#: default acq_rel atomics, each one ordered like a fence); ``relaxed`` the same
#: with relaxed atomics (the sum is read only after the kernel);
#: ``twostage`` each split stores its partial tile into a [split, ...] fp32
#: workspace and a small kernel sums and casts (CK's two-stage bwd_weight;
#: deterministic, no memset); ``fixup`` the same stores, then the last program to
#: finish a tile (a per-tile arrival counter) sums the partials in split order
#: and writes the result (deterministic, one launch, counters reset themselves;
#: the last program reads every split's partial, so it suits splits up to ~16);
#: ``atomicfix`` relaxed atomics into a persistent zeroed fp32 buffer, the last
#: program of a tile casts it out and zeroes it (one launch, any split);
#: ``streamk`` (forward, bwd_data) a persistent grid of a few programs per SM, each
#: walking an equal share of the flattened (output tile, reduction step) space, tiles
#: cut between programs finished like ``fixup`` (fills the GPU when the output tiles
#: do not: c5 7x7x512 has 100 tiles of 64x128 for an H100's SMs)
REDUCTIONS = ("atomic", "relaxed", "twostage", "fixup", "atomicfix", "streamk")
#: Triton ``num_stages`` an explicit ``_st{n}`` may ask for
STAGE_RANGE = range(1, 9)
ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}

_TRIPLE = r"(\d+)x(\d+)x(\d+)"
_NAME_RE = re.compile(
    r"^conv_(?P<dir>fwd|bwd_data|bwd_weight)_(?P<dtype>fp16|bf16|fp32)_(?P<inl>[a-z]+)_(?P<wl>[a-z]+)_(?P<outl>[a-z]+)"
    r"_(?P<nd>[123])d_(?P<pipe>" + "|".join(PIPELINES) + r")_(?P<sched>" + "|".join(SCHEDULERS) + r")"
    r"_(?P<tile>" + _TRIPLE + r")_(?P<wave>" + _TRIPLE + r")_(?P<warp>" + _TRIPLE + r")"
    r"_(?P<spec>" + "|".join(sorted(SPECIALIZATIONS, key=len, reverse=True)) + r")"
    r"(?:_vec(?P<vec>\d+_\d+_\d+))?(?:_pad(?P<pad>[01]{3}))?"
    r"(?:_st(?P<st>\d))?(?:_(?P<red>relaxed|twostage|fixup|atomicfix|streamk))?(?:_gm(?P<gm>\d+))?"
    r"(?P<tapmask>_tapmask)?(?P<flat>_flat)?(?P<rows>_rows(?:_wexp)?)?(?P<tma>_tma)?(?:_sp(?P<sp>\d+))?$")


def _triple(v) -> tuple:
    if type(v) is tuple and len(v) == 3 and type(v[0]) is type(v[1]) is type(v[2]) is int \
            and v[0] > 0 and v[1] > 0 and v[2] > 0:
        return v   # the enumeration's own tuples: nothing to convert
    t = tuple(int(x) for x in v)
    if len(t) != 3 or any(x <= 0 for x in t):
        raise InvalidProblem(f"expected three positive integers, got {v!r}")
    return t


@attrs.frozen(kw_only=True, cache_hash=True)   # selection keys its caches by configs
class ConvKernelConfig:
    """One grouped-conv kernel; ``name`` is its identity and parses back with ``from_name``."""

    direction: str = attrs.field(validator=attrs.validators.in_(DIRECTIONS))
    dtype: str = attrs.field(validator=attrs.validators.in_(DTYPES))
    ndim: int = attrs.field(validator=attrs.validators.in_((1, 2, 3)))
    layout: str = attrs.field(default="nhwgc", validator=attrs.validators.in_(tuple(LAYOUT_FAMILIES)))
    pipeline: str = attrs.field(default="compv3", validator=attrs.validators.in_(PIPELINES))
    scheduler: str = attrs.field(default="intrawave", validator=attrs.validators.in_(SCHEDULERS))
    tile: tuple = attrs.field(default=(128, 128, 32), converter=_triple)
    waves: tuple = attrs.field(default=(2, 2, 1), converter=_triple)
    warp_tile: tuple = attrs.field(default=(32, 32, 16), converter=_triple)
    specialization: str = attrs.field(default="default", validator=attrs.validators.in_(SPECIALIZATIONS))
    vector: tuple = attrs.field(default=(4, 8, 8), converter=_triple)
    pad: tuple = attrs.field(default=(True, True, True), converter=lambda v: tuple(bool(x) for x in v))
    #: Triton software-pipeline depth; 0 = the pipeline's default
    stages: int = attrs.field(default=0, converter=int)
    #: how a split reduction is combined (``REDUCTIONS``); matters only when the
    #: launch splits the reduction over several programs
    reduction: str = attrs.field(default="atomic", validator=attrs.validators.in_(REDUCTIONS))
    #: groups one program computes; 1 = one.  bwd_weight: a batched dot over groups;
    #: forward / bwd_data: one block-diagonal GEMM over the merged groups' channels
    group_merge: int = attrs.field(default=1, converter=int)
    #: tap-validity bits per pixel row (filters of at most 31 taps): forward and
    #: bwd_data build them before the main loop, bwd_weight reads them from a
    #: per-pixel table
    tap_mask: bool = attrs.field(default=False, converter=bool)
    #: depthwise forward / bwd_data: the flat-row kernel, tile = (output rows,
    #: flat (W, G) elements, 1): wide contiguous 16-byte loads for any G;
    #: forward / bwd_weight otherwise: the im2col GEMM over the flattened (tap, channel)
    #: axis, tile = (BLOCK_M, BLOCK_N, BLOCK_K) of that GEMM
    flat: bool = attrs.field(default=False, converter=bool)
    #: depthwise forward, stride 1 / dilation 1 along H and W: the row-reuse kernel,
    #: tile = (output rows RH, flat (W, G) elements, 1); 1 = weights gathered by
    #: channel in the kernel (``_rows``), 2 = from a host-expanded [taps, Wo*G]
    #: table (``_rows_wexp``)
    rows: int = attrs.field(default=0, converter=int)
    #: bwd_weight, stride 1: dy and the tap-shifted x blocks load through tensor descriptors
    #: (TMA boxes, zero-filled outside the image; ``_tma``), tile = (BLOCK_M, BLOCK_N, pixels
    #: of one output row per step)
    tma: bool = attrs.field(default=False, converter=bool)
    #: programs one output tile's reduction is split over (forward / bwd_data: BLOCK_K
    #: steps; bwd_weight: pixels), combined as ``reduction`` says; 1 = no split.
    #: ``streamk``: persistent programs per SM
    split: int = attrs.field(default=1, converter=int)

    def __attrs_post_init__(self):
        if self.split < 1:
            raise InvalidProblem(f"split={self.split}: use 1 (no split) or more")
        if self.rows not in (0, 1, 2):
            raise InvalidProblem(f"rows={self.rows}: use 0, 1 (_rows) or 2 (_rows_wexp)")
        if self.stages and self.stages not in STAGE_RANGE:
            raise InvalidProblem(f"stages={self.stages}: use 0 (pipeline default) or 1..8")
        gm = self.group_merge
        if gm < 1 or gm & (gm - 1):
            raise InvalidProblem(f"group_merge={gm} must be a power of two >= 1")

    # ---- identity -------------------------------------------------------
    @property
    def layouts(self) -> tuple:
        return LAYOUT_FAMILIES[self.layout][self.ndim]

    @property
    def name(self) -> str:
        i, w, o = (s.lower() for s in self.layouts)
        s = (f"conv_{DIR_TOKEN[self.direction]}_{self.dtype}_{i}_{w}_{o}_{self.ndim}d_{self.pipeline}_"
             f"{self.scheduler}_{'x'.join(map(str, self.tile))}_{'x'.join(map(str, self.waves))}_"
             f"{'x'.join(map(str, self.warp_tile))}_{self.specialization}")
        if self.vector != (4, 8, 8):
            s += "_vec" + "_".join(map(str, self.vector))
        if not all(self.pad):
            s += "_pad" + "".join(str(int(p)) for p in self.pad)
        if self.stages:
            s += f"_st{self.stages}"
        if self.reduction != "atomic":
            s += "_" + self.reduction
        if self.group_merge != 1:
            s += f"_gm{self.group_merge}"
        if self.tap_mask:
            s += "_tapmask"
        if self.flat:
            s += "_flat"
        if self.rows:
            s += "_rows" if self.rows == 1 else "_rows_wexp"
        if self.tma:
            s += "_tma"
        if self.split != 1:
            s += f"_sp{self.split}"
        return s

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_name(cls, name: str) -> "ConvKernelConfig":
        m = _NAME_RE.match(name)
        if not m:
            raise MissingKernel(f"{name!r} is not a conv kernel name; expected e.g. 'conv_fwd_fp16_nhwgc_gkyxc_"
                                f"nhwgk_2d_compv3_intrawave_128x128x32_2x2x1_32x32x16_default'")
        nd = int(m["nd"])
        fam = None
        for f, per in LAYOUT_FAMILIES.items():
            if tuple(s.lower() for s in per[nd]) == (m["inl"], m["wl"], m["outl"]):
                fam = f
        if fam is None:
            raise MissingKernel(f"{name!r}: layouts {m['inl']}/{m['wl']}/{m['outl']} are not a known {nd}D family")
        tri = lambda s: tuple(int(x) for x in s.split("x"))  # noqa: E731
        return cls(direction=TOKEN_DIR[m["dir"]], dtype=m["dtype"], ndim=nd, layout=fam, pipeline=m["pipe"],
                   scheduler=m["sched"], tile=tri(m["tile"]), waves=tri(m["wave"]), warp_tile=tri(m["warp"]),
                   specialization=m["spec"],
                   vector=tuple(int(x) for x in m["vec"].split("_")) if m["vec"] else (4, 8, 8),
                   pad=tuple(c == "1" for c in m["pad"]) if m["pad"] else (True, True, True),
                   stages=int(m["st"] or 0), reduction=m["red"] or "atomic", group_merge=int(m["gm"] or 1),
                   tap_mask=bool(m["tapmask"]), flat=bool(m["flat"]),
                   rows={None: 0, "_rows": 1, "_rows_wexp": 2}[m["rows"]], tma=bool(m["tma"]),
                   split=int(m["sp"] or 1))

    # ---- resources --------------------------------------------------------
    @property
    def num_warps(self) -> int:
        return self.waves[0] * self.waves[1] * self.waves[2]

    @property
    def num_stages(self) -> int:
        if self.stages:
            return self.stages
        # backward kernels gather one operand through an index table whose loads
        # take software-pipeline stages of their own (Triton 3.6 on sm90 keeps 2
        # A/B buffers at 3-4 stages and 3 at 5): more stages, same buffers
        if self.direction != "forward" and self.specialization != "depthwise" and not self._bwd_data_tm \
                and not self.flat and not self.tma:
            return PIPELINE_STAGES_BWD[self.pipeline]
        return PIPELINE_STAGES[self.pipeline]

    @property
    def _bwd_data_tm(self) -> bool:
        """bwd_data on the counter-driven kernel (tap bits / stream-K / merged groups):
        no per-step table loads."""
        return self.direction == "bwd_data" and (self.tap_mask or self.reduction == "streamk"
                                                 or self.group_merge > 1)

    @property
    def smem_buffers(self) -> int:
        """A/B tile buffers the Triton realisation keeps in shared memory (the 1x1
        stride-1 backward path has no index table: every stage is a buffer)."""
        if self.direction != "forward" and self.specialization == "filter1x1_stride1_pad0":
            return self.num_stages
        if self.stages:
            # the table-gathering backward kernels spend two stages on the table loads
            return self.stages if self.direction == "forward" or self.specialization == "depthwise" \
                or self._bwd_data_tm or self.flat or self.tma else max(1, self.stages - 2)
        return PIPELINE_STAGES[self.pipeline]

    def lds_bytes(self) -> int:
        """LDS the CK pipeline holds for the A and B block tiles."""
        if self.specialization == "depthwise":
            return 0
        m, n, k = self.tile
        return (m * k + n * k) * ELEMENT_BYTES[self.dtype] * PIPELINE_LDS_BUFFERS[self.pipeline]

    def triton_meta(self) -> dict:
        """Constexprs and launch options of the Triton kernel this config names."""
        m, n, k = self.tile
        if self.specialization == "depthwise":
            if self.rows:
                return {"BLOCK": n, "WEXP": int(self.rows == 2), "num_warps": self.num_warps,
                        "num_stages": self.num_stages}
            if self.flat:
                return {"BLOCK_R": m, "BLOCK_F": n, "num_warps": self.num_warps, "num_stages": self.num_stages}
            meta = {"BLOCK_P": m, "BLOCK_G": n, "num_warps": self.num_warps, "num_stages": self.num_stages}
            if self.direction == "bwd_weight":
                meta["WS"] = 3 if self.reduction == "atomicfix" else 0
            return meta
        if self.tma:    # tensor-descriptor bwd_weight
            return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "LINEAR": int(self.specialization == "filter1x1_stride1_pad0"),
                    "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.flat:   # im2col over the flattened (tap, channel) axis: no specialisation knobs
            meta = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_warps": self.num_warps,
                    "num_stages": self.num_stages}
            if self.direction == "forward":   # reads and writes torch's NCHW order in place
                meta["NCHW"] = int(self.layout == "ngchw")
            return meta
        spec = {"filter1x1_stride1_pad0": 1, "filter1x1_pad0": 2}.get(self.specialization, 0)
        meta = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "SPEC": spec}
        if self.direction == "forward":
            meta["TAPMASK"] = int(self.tap_mask)
            meta["STREAMK"] = int(self.reduction == "streamk")
            meta["GM"] = self.group_merge
        elif self._bwd_data_tm:
            meta["STREAMK"] = int(self.reduction == "streamk")
            meta["GM"] = self.group_merge
        elif self.group_merge > 1:
            meta["GM"] = self.group_merge
        if self.direction != "bwd_weight" or self.group_merge == 1:   # NCHW read and written in place
            meta["NCHW"] = int(self.layout == "ngchw")
        meta.update(num_warps=self.num_warps, num_stages=self.num_stages)
        return meta

    # ---- applicability ------------------------------------------------------
    def why_not(self, p: ConvProblem) -> str | None:
        """None if this kernel computes ``p``; else the reason it does not."""
        # the tuning list checks a config, the registry's shortlist the same config's key again
        got = _WHY.get((self, p), _WHY)
        if got is _WHY:
            if len(_WHY) > 65536:
                _WHY.clear()
            got = _WHY[(self, p)] = self._why_not(p)
        return got

    def _why_not(self, p: ConvProblem) -> str | None:
        if p.direction != self.direction:
            return f"direction {p.direction} != {self.direction}"
        if p.dtype != self.dtype:
            return f"dtype {p.dtype} != {self.dtype}"
        if p.ndim != self.ndim:
            return f"{p.ndim}D problem, {self.ndim}D kernel"
        if p.layout_family != self.layout:
            return f"layout {p.layout_family} != {self.layout}"
        dw = p.c_per_group == 1 and p.k_per_group == 1
        spec = self.specialization
        if self.split > 1 and (self.rows or (spec == "depthwise" and self.direction != "bwd_weight")
                               or (self.flat and self.direction != "bwd_weight")):
            return "depthwise forward / bwd_data and flat forward kernels do not split their reduction"
        if spec == "depthwise":
            if self.group_merge != 1 or self.tap_mask or self.tma:
                return "depthwise kernels have no group merging, tap mask or tensor-descriptor form"
            if self.reduction != "atomic" and not (self.direction == "bwd_weight" and self.reduction == "atomicfix"):
                return "depthwise kernels reduce by atomics (bwd_weight: also atomicfix)"
            if self.flat and self.direction == "bwd_weight":
                return "the flat-row depthwise kernel exists for forward and bwd_data"
            if self.flat and (self.tile[0] & (self.tile[0] - 1) or self.tile[1] & (self.tile[1] - 1)):
                return f"flat-row tile {self.tile[:2]} must be powers of two"
            if self.rows:
                why = rows_why_not(self, p)
                if why:
                    return why
            if not dw:
                return "depthwise kernel needs C = K = G (one channel per group)"
            return self._split_why_not(p)
        if self.tma:
            return self._tma_why_not(p)
        if self.flat:
            return self._flat_why_not(p)
        if self.rows:
            return "the row-reuse kernel exists for depthwise kernels only"
        if self.reduction == "streamk":
            if self.direction == "bwd_weight":
                return "stream-K exists for forward and bwd_data (bwd_weight splits its pixel reduction)"
            if self.direction == "bwd_data" and not self.tap_mask and not p.specialization.startswith("filter1x1"):
                return "bwd_data stream-K runs on the tap-bit kernel: add the tap mask"
        if self.group_merge > 1:
            gm = self.group_merge
            if p.G == 1:
                return "group merging needs a grouped problem (G > 1)"
            if self.tile[0] < 16 or self.tile[1] < 16 or self.tile[2] < 16:
                return "group-merged kernels need block tiles of at least 16 (batched dot)"
            if self.direction != "bwd_weight":
                # one block-diagonal GEMM over gm groups: whole groups per reduction block
                red = p.c_per_group if self.direction == "forward" else p.k_per_group
                if p.G % gm:
                    return f"G={p.G} is not a multiple of the {gm} merged groups"
                if self.tile[2] % red:
                    return f"BLOCK_K {self.tile[2]} must hold whole groups of {red} reduction channels"
                if self.direction == "bwd_data" and not self.tap_mask \
                        and not p.specialization.startswith("filter1x1"):
                    return "bwd_data group merging runs on the tap-bit kernel: add the tap mask"
        if self.tap_mask:
            if p.taps > 31:
                return f"tap mask holds 31 taps; the filter has {p.taps}"
            if p.specialization.startswith("filter1x1") or self.specialization.startswith("filter1x1"):
                return "a 1x1 filter without padding has nothing to mask"
        if spec == "filter1x1_stride1_pad0" and p.specialization != "filter1x1_stride1_pad0":
            return f"needs 1x1 filter, stride 1, pad 0; problem is {p.specialization}"
        if spec == "filter1x1_pad0" and p.specialization not in ("filter1x1_pad0", "filter1x1_stride1_pad0"):
            return f"needs 1x1 filter, pad 0; problem is {p.specialization}"
        if spec == "filter3x3" and p.specialization != "filter3x3":
            return "needs a 3x3 filter"
        m, n, k = p.gemm_mnk
        pm, pn, pk = self.pad
        tm, tn, tk = self.tile
        if not pm and m % tm:
            return f"GEMM M={m} not a multiple of {tm} and M padding is off"
        if not pn and n % tn:
            return f"GEMM N={n} not a multiple of {tn} and N padding is off"
        if not pk and k % tk:
            return f"GEMM K={k} not a multiple of {tk} and K padding is off"
        vec_c = p.c_per_group if p.direction != "bwd_weight" else p.k_per_group
        if self.vector[0] > 1 and vec_c % self.vector[0] and not pk:
            return f"vector size {self.vector[0]} does not divide {vec_c} channels"
        return self._split_why_not(p)

    def _tma_why_not(self, p: ConvProblem) -> str | None:
        """The tensor-descriptor bwd_weight kernel (stride 1; dy and x blocks as TMA boxes)."""
        if self.direction != "bwd_weight":
            return "the tensor-descriptor kernel exists for bwd_weight"
        if self.flat or self.rows or self.tap_mask or self.group_merge != 1 or self.reduction == "streamk":
            return "the tensor-descriptor kernel has no flat / row / tap-mask / merged-group / stream-K form"
        if self.dtype == "fp32":
            return "the tensor-descriptor kernel is written for fp16 / bf16"
        if any(s != 1 for s in p.stride):
            return "the tensor-descriptor kernel needs stride 1 (a box is a run of output columns)"
        spec = self.specialization
        if spec not in ("default", "filter3x3", "filter1x1_stride1_pad0"):
            return f"no tensor-descriptor kernel for the {spec} specialisation"
        if spec != "default" and p.specialization != spec:
            return f"needs the {spec} specialisation; problem is {p.specialization}"
        m, n, k = self.tile
        if any(t < 16 or t > 256 or t & (t - 1) for t in self.tile):
            return f"tensor-descriptor tile {self.tile}: powers of two in 16..256 (box sizes)"
        eb = ELEMENT_BYTES[self.dtype]
        if (p.C * eb) % 16 or (p.K * eb) % 16:
            return f"channel rows of {p.C} / {p.K} elements are not 16-byte multiples (TMA strides)"
        if p.G > 1 and (p.c_per_group % n or p.k_per_group % m):
            return f"grouped: a box must not cross groups ({p.c_per_group} / {p.k_per_group} channels per group, " \
                   f"tile {m}x{n})"
        return self._split_why_not(p)

    def _flat_why_not(self, p: ConvProblem) -> str | None:
        """The im2col kernels over the flattened (tap, channel) axis (forward, bwd_weight)."""
        if self.direction == "bwd_data":
            return "the flat (tap, channel) im2col kernels exist for forward and bwd_weight"
        if self.rows or self.tap_mask or self.group_merge != 1 or self.reduction == "streamk":
            return "flat im2col kernels have no row reuse, tap mask, group merging or stream-K"
        if self.specialization not in ("default", "filter3x3"):
            return "flat im2col kernels are written for the default and 3x3 specialisations"
        if self.specialization == "filter3x3" and p.specialization != "filter3x3":
            return "needs a 3x3 filter"
        if any(t < 16 or t & (t - 1) for t in self.tile):
            return f"flat im2col tile {self.tile}: powers of two >= 16 (tensor-core dots)"
        return self._split_why_not(p)

    def _split_why_not(self, p: ConvProblem) -> str | None:
        if self.split == 1:
            return None if p.split_k in (0, 1) else f"problem asks for split_k={p.split_k}, kernel does not split"
        if p.split_k not in (0, self.split):
            return f"problem asks for split_k={p.split_k}, kernel splits {self.split} ways"
        if self.reduction == "streamk":
            return None  # split = persistent programs per SM: any count runs
        if self.reduction in ("twostage", "fixup") and self.split * _result_size(p) >= 2 ** 31:
            return f"a {self.reduction} workspace of {self.split} x the output overflows 32-bit offsets"

        nsplit, _ = split_plan(self, p)
        if nsplit != self.split:
            return (f"the reduction cut in {self.split} parts leaves {nsplit} non-empty ones; "
                    f"a kernel with split {nsplit} runs it")
        return None

    def supports(self, p: ConvProblem) -> bool:
        return self.why_not(p) is None


_WHY: dict = {}


def _result_size(p: ConvProblem) -> int:
    """Elements of the tensor ``p``'s direction writes."""
    if p.direction == "bwd_weight":
        return p.K * p.c_per_group * p.taps
    return p.N * (p.K * math.prod(p.output_spatial) if p.direction == "forward" else p.C * math.prod(p.input_spatial))


def is_extended(cfg: ConvKernelConfig) -> bool:
    """Whether ``cfg`` uses a knob of the Triton realisation beyond CK's tile space."""
    return bool(cfg.stages or cfg.reduction != "atomic" or cfg.group_merge != 1 or cfg.tap_mask or cfg.flat
                or cfg.rows or cfg.tma)


def rows_why_not(cfg: ConvKernelConfig, p: ConvProblem) -> str | None:
    """Why the row-reuse depthwise kernel (``_rows``) cannot run ``p`` (None: it can)."""
    if cfg.direction != "forward":
        return "the row-reuse depthwise kernel exists for forward only"
    if cfg.flat:
        return "_rows and _flat are different kernels; pick one"
    rh, blk, _ = cfg.tile
    rows = conv_facts()["rows_rh"]
    if rh not in rows or blk & (blk - 1) or blk < 16:
        return f"row-reuse tile {cfg.tile[:2]}: rows in {rows}, span a power of two >= 16"
    sp = (1,) * (3 - p.ndim)
    st, dil = sp + tuple(p.stride), sp + tuple(p.dilation)
    flt, pad = sp + tuple(p.filter), (0,) * (3 - p.ndim) + tuple(p.pad_left)
    if st[1:] != (1, 1) or dil[1:] != (1, 1):
        return "the row-reuse depthwise kernel needs stride 1 and dilation 1 along H and W"
    if flt[0] != 1 or st[0] != 1 or pad[0] != 0 or tuple(p.input_spatial)[:-2] != tuple(p.output_spatial)[:-2]:
        return "the row-reuse depthwise kernel needs a 1-deep filter, stride 1 and no padding along D"
    if p.filter[-1] > 15 or (p.filter[-2] if p.ndim > 1 else 1) > 15:
        return "the row-reuse depthwise kernel unrolls filters up to 15x15"
    return None


# -- legality on an arch ---------------------------------------------------------------

def cull_reason(cfg: ConvKernelConfig, *, warp_size: int, lds_bytes: int, warp_tiles,
                max_threads: int) -> str | None:
    """Why ``cfg`` is illegal on an arch with these facts (None: legal)."""
    if cfg.specialization == "depthwise":
        return None
    tm, tn, tk = cfg.tile
    wm, wn, wk = cfg.waves
    xm, xn, xk = cfg.warp_tile
    if tuple(cfg.warp_tile) not in {tuple(t) for t in warp_tiles}:
        return f"warp tile {cfg.warp_tile} not a matrix-instruction tile of this arch for {cfg.dtype}"
    if tm % (wm * xm) or tn % (wn * xn) or tk % (wk * xk):
        return f"block tile {cfg.tile} is not a multiple of waves {cfg.waves} x warp tile {cfg.warp_tile}"
    if cfg.num_warps * warp_size > max_threads:
        return f"{cfg.num_warps} waves of {warp_size} lanes exceed {max_threads} threads"
    if cfg.lds_bytes() > lds_bytes:
        return f"needs {cfg.lds_bytes()} B of LDS, arch has {lds_bytes}"
    if cfg.direction != "forward" and cfg.pipeline not in ("compv3", "mem"):
        return "backward kernels use the compv3 or mem pipeline only (CK)"
    if cfg.scheduler == "interwave" and cfg.pipeline != "mem":
        return "interwave scheduling exists for the mem pipeline only"
    # each lane must load whole vectors of the A and B tiles
    lanes = cfg.num_warps * warp_size
    if (tm * tk) % (lanes * cfg.vector[0]) and (tm * tk) >= lanes * cfg.vector[0]:
        return f"A tile {tm}x{tk} does not split into {lanes} lanes x vector {cfg.vector[0]}"
    if (tn * tk) % (lanes * cfg.vector[1]) and (tn * tk) >= lanes * cfg.vector[1]:
        return f"B tile {tn}x{tk} does not split into {lanes} lanes x vector {cfg.vector[1]}"
    return None


# -- the kernel keys: KernelKey("conv", ConvSignature, ConvAlgorithm, arch, backend) -------------
# A key's body is its config's name (ConvKernelConfig.name).

@attrs.frozen(cache_hash=True)
class ConvSignature:
    """What a conv kernel computes."""

    direction: str
    dtype: str
    ndim: int
    layout: str = "nhwgc"

    def name_body(self, alg: "ConvAlgorithm") -> str:
        return _name_head(self) + _name_tail(alg)


@attrs.frozen(cache_hash=True)
class ConvAlgorithm:
    """How: CK's implicit-GEMM tile, waves, warp tile, pipeline, specialisation."""

    tile_m: int
    tile_n: int
    tile_k: int
    warp_m: int
    warp_n: int
    warp_k: int
    warp_tile_m: int
    warp_tile_n: int
    warp_tile_k: int
    pipeline: str = "compv3"
    scheduler: str = "intrawave"
    specialization: str = "default"
    vector_a: int = 4
    vector_b: int = 8
    vector_c: int = 8
    pad_m: bool = True
    pad_n: bool = True
    pad_k: bool = True
    #: Triton realisation knobs (ck_conv.keys.ConvKernelConfig); defaults leave names unchanged
    stages: int = 0
    reduction: str = "atomic"
    group_merge: int = 1
    tap_mask: bool = False
    flat: bool = False
    rows: int = 0
    tma: bool = False
    split: int = 1

    @property
    def num_warps(self) -> int:
        return self.warp_m * self.warp_n * self.warp_k


@functools.lru_cache(maxsize=1 << 18)
def to_config(sig: ConvSignature, a: ConvAlgorithm) -> ConvKernelConfig:
    return ConvKernelConfig(direction=sig.direction, dtype=sig.dtype, ndim=sig.ndim, layout=sig.layout,
                              pipeline=a.pipeline, scheduler=a.scheduler, tile=(a.tile_m, a.tile_n, a.tile_k),
                              waves=(a.warp_m, a.warp_n, a.warp_k),
                              warp_tile=(a.warp_tile_m, a.warp_tile_n, a.warp_tile_k),
                              specialization=a.specialization, vector=(a.vector_a, a.vector_b, a.vector_c),
                              pad=(a.pad_m, a.pad_n, a.pad_k), stages=a.stages, reduction=a.reduction,
                              group_merge=a.group_merge, tap_mask=a.tap_mask, flat=a.flat,
                              rows=a.rows, tma=a.tma, split=a.split)


def from_config(c: ConvKernelConfig) -> tuple:
    sig = ConvSignature(c.direction, c.dtype, c.ndim, c.layout)
    alg = ConvAlgorithm(*c.tile, *c.waves, *c.warp_tile, pipeline=c.pipeline, scheduler=c.scheduler,
                        specialization=c.specialization, vector_a=c.vector[0], vector_b=c.vector[1],
                        vector_c=c.vector[2], pad_m=c.pad[0], pad_n=c.pad[1], pad_k=c.pad[2],
                        stages=c.stages, reduction=c.reduction, group_merge=c.group_merge, tap_mask=c.tap_mask,
                        flat=c.flat, rows=c.rows, tma=c.tma, split=c.split)
    return sig, alg


_DEFAULT_ALG = ConvAlgorithm(128, 128, 32, 2, 2, 1, 32, 32, 16)


def evolved(cfg: ConvKernelConfig, **changes) -> ConvKernelConfig:
    """``attrs.evolve(cfg, **changes)``, one object per distinct result: selection builds the
    same few dozen variants of a problem's pick for every new problem, and a config built
    once keeps its hash (so the memos keyed by it cost a lookup)."""
    try:
        return _evolved(cfg, tuple(changes.items()))
    except TypeError:   # an unhashable value (a list tile): build it plainly
        return attrs.evolve(cfg, **changes)


@functools.lru_cache(maxsize=1 << 15)
def _evolved(cfg: ConvKernelConfig, changes: tuple) -> ConvKernelConfig:
    return attrs.evolve(cfg, **dict(changes))


@functools.lru_cache(maxsize=1 << 16)
def config_of(key) -> ConvKernelConfig:
    # one config object per key: its hash (and so every cache keyed by it) is computed once
    return to_config(key.signature, key.algorithm)


@functools.lru_cache(maxsize=1 << 16)
def key_of(cfg: ConvKernelConfig, arch: str, backend: str = "numpy") -> KernelKey:
    sig, alg = from_config(cfg)
    return KernelKey("conv", sig, alg, arch, backend)


def format_name(sig, alg) -> str:
    return sig.name_body(alg)


#: any signature: the name's algorithm part does not depend on it
_CANON = ConvSignature("forward", "fp16", 2, "nhwgc")


@functools.lru_cache(maxsize=256)
def _name_head(sig: ConvSignature) -> str:
    """``conv_<dir>_<dtype>_<layouts>_<n>d_``: the part of a name the signature spells."""
    c = to_config(sig, _DEFAULT_ALG)
    return c.name[:c.name.index(f"_{sig.ndim}d_") + 4]


@functools.lru_cache(maxsize=1 << 18)
def _name_tail(alg: "ConvAlgorithm") -> str:
    """The rest of a name (pipeline, tiles, specialisation, knobs), one per algorithm: listing a
    space names every algorithm once per signature without building a config each time."""
    return to_config(_CANON, alg).name[len(_name_head(_CANON)):]


def parse_name(body: str):
    return from_config(ConvKernelConfig.from_name(body))


SIG_CHOICES = {"direction": DIRECTIONS, "dtype": DTYPES, "layout": tuple(LAYOUT_FAMILIES)}
ALG_CHOICES = {"pipeline": PIPELINES, "scheduler": SCHEDULERS, "specialization": SPECIALIZATIONS,
               "reduction": REDUCTIONS}
_SIZE = (1, 1 << 16)
ALG_BOUNDS = {**{f: _SIZE for f in ("tile_m", "tile_n", "tile_k", "warp_m", "warp_n", "warp_k", "warp_tile_m",
                                     "warp_tile_n", "warp_tile_k", "vector_a", "vector_b", "vector_c",
                                     "group_merge")},
              "stages": (0, max(STAGE_RANGE)), "rows": (0, 2)}


_SIG = RecordSchema(ConvSignature, what="conv signature", choices=SIG_CHOICES, bounds={"ndim": (1, 3)})
_ALG = RecordSchema(ConvAlgorithm, what="conv algorithm", choices=ALG_CHOICES, bounds=ALG_BOUNDS)


def from_fields(sig: dict, alg: dict):
    """Signature and algorithm of untrusted field dicts (JSON), every field checked."""
    s, a = _SIG(sig), _ALG(alg)
    try:
        to_config(s, a)   # the config's own rules (power-of-two group merge, ...)
    except InvalidProblem as exc:
        raise ConfigError(f"conv kernel fields: {exc}") from None
    return s, a


def legal(key, arch) -> str | None:
    """Why the enumeration rules would not produce ``key`` on ``arch`` (or None)."""
    c = config_of(key)
    why = cull_reason(c, warp_size=arch.warp_size, lds_bytes=arch.lds_bytes,
                      warp_tiles=dict(arch.warp_tiles).get(c.dtype, ()),
                      max_threads=conv_facts(arch)["max_block_threads"])
    if why is None and c.dtype not in arch.dtypes:
        why = f"{arch.name} has no {c.dtype} matrix instructions"
    if why is None and getattr(arch, "vendor", "") == "nvidia" and c.specialization != "depthwise":
        need = (c.tile[0] + c.tile[1]) * c.tile[2] * ELEMENT_BYTES[c.dtype] * c.smem_buffers
        if need > arch.lds_bytes:
            why = f"needs {need} B of shared memory, {arch.name} has {arch.lds_bytes} B"
    return why


def supports(key, problem) -> str | None:
    if not isinstance(problem, ConvProblem):
        return f"not a conv problem ({type(problem).__name__})"
    return config_of(key).why_not(problem)
