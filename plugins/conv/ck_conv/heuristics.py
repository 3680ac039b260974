"""Selection rules of the conv op: the heuristic pick, the tuning lists, the split sizing, the ranking.

:func:`heuristic_config` is the kernel a problem gets with no tuning data;
:func:`candidate_configs` its short tuning list (the classic tiles, then the
Triton realisation variants of :func:`extended_candidates`), whose tiles are
tuned data (``tuned/<arch>.json``, else ``tuned/generic.json``) and whose wave
and buffer rules plan for the ArchSpec's SM count and shared memory.  The split
is a key field (``ConvKernelConfig.split``); :func:`heuristic` ranks the
registry's keys by closeness to the pick and to the split that fills the GPU
(the arch's compute units), so the launcher never sizes a split itself.
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import attrs

from ck_core.tuned_data import EMPTY, table

from .geometry import launches, reduction_shape, split_plan, streamk_fits
from .keys import ELEMENT_BYTES, ConvKernelConfig, as_tuples, config_of, conv_facts, evolved, key_of
from .space import _splits
from .problem import ConvProblem

#: ``fixup``'s preferred split stops here: the last program of a tile reads every partial
FIXUP_MAX_SPLIT = 16
#: the workspace reductions, which cost no atomics and no memset
EAGER_REDUCTIONS = ("twostage", "fixup", "atomicfix")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def auto_split_k(p: ConvProblem, cfg: ConvKernelConfig, num_sms: int) -> int:
    """Split of the bwd_weight pixel reduction that fills about two waves of the GPU."""
    tiles, P = reduction_shape(cfg, p)
    min_chunk = 4 * cfg.tile[0] if cfg.specialization == "depthwise" else 8 * cfg.tile[2]
    kind = "depthwise" if cfg.specialization == "depthwise" else "flat" if cfg.flat else "tma" if cfg.tma \
        else "default"
    want = max(1, _cdiv(int(_split_target(kind)) * num_sms, tiles))
    if cfg.reduction == "fixup":
        want = min(want, FIXUP_MAX_SPLIT)
    return max(1, min(want, P // min_chunk if P >= min_chunk else 1))


def _split_target(kind: str) -> float:
    """Programs per SM the preferred bwd_weight split aims at (tuned data, ``split_target``)."""
    t = table("conv", "generic", "split_target", TUNED_DIR, check=check_entry)
    return t[kind] if kind in t else t["default"]


def auto_split_mn(tiles: int, steps: int, num_sms: int, eager: bool = False) -> int:
    """Split-K for forward / bwd_data: only when the output tiles leave most SMs idle.

    ``eager`` (the workspace reductions): the split (at most 8, at least 8 steps
    per split) whose programs fill the last wave best, one program per SM
    assumed, a little penalty per extra split.
    """
    if eager:
        best, score = 1, None
        for sp in range(1, min(8, steps // 8) + 1):
            n = tiles * sp
            sc = n / (_cdiv(n, num_sms) * num_sms) - 0.03 * (sp - 1)
            if score is None or sc > score + 1e-9:
                best, score = sp, sc
        return best
    if tiles * 2 >= num_sms or steps < 8:
        return 1
    return max(1, min(num_sms // tiles, steps // 4))


def preferred_split(cfg: ConvKernelConfig, p: ConvProblem, num_sms: int, smem_bytes: int | None = None) -> int:
    """The split of ``cfg``'s tile and reduction that suits ``p`` on ``num_sms`` SMs/CUs
    (stream-K: programs per SM, two where two buffer sets fit ``smem_bytes``)."""
    if p.split_k:
        return p.split_k
    # the shortlist's splits and the ranking ask about the same (config, problem) again
    memo = (cfg, p, num_sms, smem_bytes)
    got = _PREFERRED.get(memo)
    if got is None:
        if len(_PREFERRED) > 65536:
            _PREFERRED.clear()
        got = _PREFERRED[memo] = _preferred_split(cfg, p, num_sms, smem_bytes)
    return got


_PREFERRED: dict = {}


def _preferred_split(cfg: ConvKernelConfig, p: ConvProblem, num_sms: int, smem_bytes: int | None) -> int:
    if cfg.reduction == "streamk":
        return streamk_fits(cfg, smem_bytes or plan_facts()[1])
    if cfg.rows or p.direction != "bwd_weight" and (cfg.flat or cfg.specialization == "depthwise"):
        return 1
    if p.direction == "bwd_weight":
        sp = auto_split_k(p, cfg, num_sms)
    else:
        tiles, steps = reduction_shape(cfg, p)
        sp = auto_split_mn(tiles, steps, num_sms, eager=cfg.reduction in EAGER_REDUCTIONS)
    return sp if sp <= 1 or split_pays(cfg, p, sp, num_sms) else 1


def launch_cost() -> tuple[float, float]:
    """``(launch_us, step_us)`` of the tuned ``launch_cost`` table: what one more device launch
    costs an eager call, and the time of one reduction step of a program (one BLOCK_K step of
    a forward / bwd_data tile, one pixel block of a bwd_weight tile), which a split saves."""
    t = table("conv", "generic", "launch_cost", TUNED_DIR, check=check_entry)
    return float(t["launch_us"]) if "launch_us" in t else 0.0, float(t["step_us"]) if "step_us" in t else 1.0


def nchw_in_place_limit() -> int:
    """Multiply-adds (N * input pixels * K * C/groups * taps) up to which an NCHW call runs on the
    kernels that read NCHW in place (tuned ``launch_cost`` table, ``nchw_in_place_max_mmac``, in
    millions): there the three layout copies' launches cost more than the in-place kernels' strided
    loads; above it the public API hands the kernels channels-last copies."""
    t = table("conv", "generic", "launch_cost", TUNED_DIR, check=check_entry)
    return int(t["nchw_in_place_max_mmac"] * 1e6) if "nchw_in_place_max_mmac" in t else 0


def split_pays(cfg: ConvKernelConfig, p: ConvProblem, split: int, num_sms: int) -> bool:
    """Whether splitting ``cfg``'s reduction ``split`` ways on ``p`` saves more time than the launches
    the split adds cost (:func:`ck_conv.geometry.launches`: an ``atomic`` split adds a memset and a
    cast, ``twostage`` a reduce kernel): waves of programs x their steps x ``step_us``, plus the extra
    launches x ``launch_us`` (:func:`launch_cost`).  Splits that add no launch always pay."""
    extra = launches(cfg, split) - launches(cfg, 1)
    if extra <= 0:
        return True
    launch_us, step_us = launch_cost()
    tiles, red = reduction_shape(cfg, p)
    if p.direction == "bwd_weight":   # the pixel reduction, in blocks of the kernel's pixel unit
        red = _cdiv(red, cfg.tile[0] if cfg.specialization == "depthwise" else cfg.tile[2])
    sms = max(int(num_sms), 1)
    whole = _cdiv(tiles, sms) * red * step_us
    cut = _cdiv(tiles * split, sms) * _cdiv(red, split) * step_us + extra * launch_us
    return cut < whole


def named_split(cfg: ConvKernelConfig, p: ConvProblem, arch, split: int | None = None) -> tuple:
    """``(config, problem)`` to time ``cfg`` split ``split`` ways (None: :func:`preferred_split` for
    ``arch``'s compute units and shared memory, an ArchSpec).

    For callers that hold configs rather than the Dispatcher's keys (the kernel
    benchmarks): the config gets the split its launch really makes (a short
    reduction has fewer parts than asked) and the problem asks for exactly that.
    """
    p0 = attrs.evolve(p, split_k=0)
    c = attrs.evolve(cfg, split=split or preferred_split(cfg, p0, arch.compute_units, arch.lds_bytes))
    if c.reduction != "streamk":
        c = attrs.evolve(c, split=split_plan(c, p0)[0])
    return c, attrs.evolve(p, split_k=c.split)


def heuristic(problem, candidates, arch) -> list:
    """Rank candidates by closeness to :func:`heuristic_config`'s pick (where the ``first_tier``
    table names families for the problem's class: to the first candidate of those families)."""
    want = _anchor(problem, arch)
    cus = max(int(arch.compute_units or 1), 1)

    def score(k):
        c = config_of(k)
        return _closeness(c, want, split_for(c))

    preferred: dict = {}

    def split_for(c):
        # what the preferred split depends on (not the split itself): one computation per family
        fam = (c.tile, c.group_merge, c.tap_mask, c.reduction, c.stages, c.pipeline, c.flat, c.rows,
               c.specialization)
        if fam not in preferred:
            # the unsplit twin: the shortlist asked preferred_split about that very object
            preferred[fam] = preferred_split(c if c.split == 1 else evolved(c, split=1), problem, cus,
                                             arch.lds_bytes)
        return preferred[fam]

    return sorted(candidates, key=score)   # the Dispatcher passes the keys that support the problem


def _anchor(p: ConvProblem, arch) -> ConvKernelConfig:
    cls = problem_class(p, arch)
    if cls is not None and cls in table("conv", "generic", "first_tier", TUNED_DIR, check=check_entry):
        return candidate_configs(p, arch=arch)[0]
    return heuristic_config(p)


_SPEC_RANK = {"depthwise": 0, "filter1x1_stride1_pad0": 0, "filter1x1_pad0": 1, "filter3x3": 2, "default": 3}


@functools.lru_cache(maxsize=1 << 15)
def _closeness(c: ConvKernelConfig, want: ConvKernelConfig, split: int) -> float:
    """How far ``c`` is from the pick ``want`` when ``split`` fills the GPU for ``c``'s tile
    (the launcher never sizes one); the same few hundred triples recur for every new problem."""
    s = sum(abs(math.log2(a / b)) for a, b in zip(c.tile, want.tile))
    s += 0.5 * (c.pipeline != want.pipeline) + 0.25 * (c.waves != want.waves)
    s += 0.1 * _SPEC_RANK.get(c.specialization, 3) + 0.05 * (c.warp_tile != want.warp_tile)
    s += 2.0 * (family_of(c) != family_of(want))
    return s + 0.3 * abs(math.log2(c.split / split))


# -- the heuristic pick and the tuning lists ---------------------------------------------------

def _pow2_at_least(x: int, lo: int, hi: int) -> int:
    v = lo
    while v < x and v < hi:
        v *= 2
    return v


def heuristic_config(p: ConvProblem) -> ConvKernelConfig:
    """A good default kernel for ``p`` on a tensor-core GPU (tuned on an H100): the pick the ranking
    of :func:`heuristic` measures every key against, and the first of :func:`candidate_configs`."""
    # asked three times per new problem (tuning list, its extension, the ranking)
    got = _PICKS.get(p)
    if got is None:
        if len(_PICKS) > 65536:
            _PICKS.clear()
        got = _PICKS[p] = _heuristic_config(p)
    return got


_PICKS: dict = {}


def _heuristic_config(p: ConvProblem) -> ConvKernelConfig:
    common = dict(direction=p.direction, dtype=p.dtype, ndim=p.ndim, layout=p.layout_family,
                  split=p.split_k or 1)
    if p.c_per_group == 1 and p.k_per_group == 1:
        tile = (128, 32, 1) if p.direction != "bwd_weight" else (8, 32, 1)
        return ConvKernelConfig(pipeline="mem", tile=tile, waves=(4, 1, 1), warp_tile=(1, 1, 1),
                                specialization="depthwise", **common)
    spec = p.specialization
    m, n, k = p.gemm_mnk
    red_chan = p.c_per_group if p.direction != "bwd_data" else p.k_per_group
    if p.direction == "bwd_weight":
        # M = K, N = C (per tap), reduction over pixels
        tm = _pow2_at_least(p.k_per_group, 16, 128)
        tn = _pow2_at_least(p.c_per_group, 16, 128)
        tk = 64 if p.dtype != "fp32" else 32
        waves = (2, 2, 1) if tm * tn >= 64 * 64 else (1, 2, 1) if tm * tn >= 32 * 32 else (1, 1, 1)
        if tm * tn >= 128 * 64:
            waves = (2, 4, 1)
        pipe = "compv3"
    else:
        tn = _pow2_at_least(n, 16, 128)
        tk = min(64 if p.dtype != "fp32" else 32, _pow2_at_least(red_chan, 16, 64))
        tm = 128 if m >= 8192 else 64
        if tn <= 32:
            tm = 128
        waves = (2, 4, 1) if tm * tn >= 128 * 64 else (2, 2, 1) if tm * tn >= 64 * 64 else (2, 1, 1)
        if m < 16384 and tn >= 64:
            tm = 64  # small pixel counts: more tiles to fill the SMs
            waves = (2, 2, 1) if tn <= 64 else (2, 4, 1)
        pipe = "compv3"
    return ConvKernelConfig(pipeline=pipe, tile=(tm, tn, tk), waves=waves, warp_tile=(16, 16, 16),
                            specialization=spec, **common)


def family_of(c: ConvKernelConfig) -> str:
    """The kernel family of a config, as the ``first_tier`` tuned table names them: ``tma`` (tensor-
    descriptor bwd_weight), ``flat`` (im2col over (tap, channel)), ``dw_atomicfix`` / ``dw`` (depthwise
    bwd_weight with the one-launch or the memset + atomics + cast reduction; ``dw`` also the
    depthwise forward / bwd_data kernels), ``gemm`` (the implicit-GEMM kernels)."""
    if c.specialization == "depthwise":
        return "dw_atomicfix" if c.reduction == "atomicfix" else "dw"
    return "tma" if c.tma else "flat" if c.flat else "gemm"


def problem_class(p: ConvProblem, arch=None) -> str | None:
    """The class of ``p`` the ``first_tier`` table is keyed by (None: none of them); grouped
    stride-1 bwd_weight (ResNeXt) is no class: the tensor-descriptor kernel was not measured there."""
    if p.c_per_group == 1 and p.k_per_group == 1:
        return "depthwise_" + p.direction
    if p.direction != "bwd_data" and p.G == 1 and p.c_per_group <= int(_lists("flat", "max_channels", arch)) \
            and p.specialization in ("default", "filter3x3"):
        return "stem_" + p.direction
    if p.direction == "bwd_weight" and all(s == 1 for s in p.stride) and p.G == 1:
        return "stride1_bwd_weight"
    return None


def candidate_configs(p: ConvProblem, limit: int | None = None, extended: bool = True,
                      arch=None) -> list[ConvKernelConfig]:
    """A short tuning list for ``p`` (the heuristic pick first), for autotuning on a GPU.

    ``extended`` appends :func:`extended_candidates` (workspace split reductions,
    tap bits, deeper pipelines, merged groups) after the classic list.  The
    tiles come from the tuned data (ck_conv/tuned/); ``arch`` (an ArchSpec) picks
    its file and gives the SM count and shared memory the rules plan for.
    Where the tuned ``first_tier`` table names kernel families for the problem's class
    (:func:`problem_class`, :func:`family_of`), the extended list keeps those families only
    (the H100 measurements found the others dominated there; the heuristic pick may go too).
    """
    out = _candidate_configs(p, extended, arch)
    if extended:
        cls = problem_class(p, arch)
        t = table("conv", "generic", "first_tier", TUNED_DIR, check=check_entry)
        if cls is not None and cls in t:
            only = set(t[cls])
            out = [c for c in out if family_of(c) in only] or out
        if p.direction == "bwd_weight" and out[0].specialization == "depthwise":
            # one fp32 accumulator per filter tap and element: tiles that would spill go
            most = float(_lists("depthwise_bwd_weight", "max_acc_per_thread", arch))
            warp = int((arch or _planned_arch(table("conv", "generic", "plan", TUNED_DIR, check=check_entry)["arch"])).warp_size)
            out = [c for c in out if c.tile[0] * c.tile[1] * p.taps / (warp * c.num_warps) <= most] or out
    return out[:limit] if limit else out


def _candidate_configs(p: ConvProblem, extended: bool, arch) -> list[ConvKernelConfig]:
    base = heuristic_config(p)
    out = [base]
    held = {base}   # membership of ``out`` without a list scan per candidate

    def add(tile, waves, pipe="compv3"):
        c = evolved(base, tile=tile, waves=waves, pipeline=pipe)
        if c not in held and c.why_not(p) is None:
            out.append(c)
            held.add(c)

    if base.specialization == "depthwise":
        tiles = _lists("depthwise_tiles", "bwd_weight" if p.direction == "bwd_weight" else "forward", arch)
        if extended and p.direction != "bwd_weight":
            # the flat-row kernel reads the same bytes in wide rows: keep the classic
            # tiles that won on the H100 (128x16, 256x16) as the reference
            tiles = _lists("depthwise_tiles", "forward_reference", arch)
        for t in tiles:
            add(t, (4, 1, 1), "mem")
        if p.direction != "bwd_weight" and not extended:
            for t in _lists("depthwise_tiles", "forward_8warps", arch):
                add(t, (8, 1, 1), "mem")
        if extended:
            out += [c for c in extended_candidates(p, arch) if c not in held]
        return out
    m, n, k = p.gemm_mnk
    if p.direction == "bwd_weight":
        tm = _pow2_at_least(p.k_per_group, 16, 128)
        tn = _pow2_at_least(p.c_per_group, 16, 128)
        # the tuned tiles, then one that covers the group's channels whole
        for (a, b, c), w, pipe in _lists("bwd_weight_classic", "all", arch) + (((tm, tn, 128), (2, 2, 1), "mem"),):
            add((min(a, tm), min(b, tn), c), w if min(a, tm) * min(b, tn) >= 64 * 64 else (1, 2, 1), pipe)
    else:
        bn = _pow2_at_least(n, 16, 128)
        bk = base.tile[2]
        fwd = p.direction == "forward"
        opts = [((128, bn, bk), (2, 2, 1), "compv3"), ((128, bn, bk), (2, 4, 1), "compv3"),
                ((64, bn, bk), (2, 2, 1), "compv3"), ((128, bn, bk), (2, 2, 1), "mem")]
        if fwd:
            opts += [((128, bn, bk), (2, 4, 1), "compv4"), ((128, bn, 32), (2, 4, 1), "compv4")]
        if bn >= 64:
            opts += [((256, bn, bk), (2, 4, 1), "compv3"), ((64, bn, bk), (2, 2, 1), "mem")]
        if n >= 256:
            opts += [((128, 256, bk), (2, 4, 1), "compv4" if fwd else "compv3"),
                     ((64, 256, bk), (2, 4, 1), "compv3")]
        for t, w, pipe in opts:
            add(t, w if t[0] * t[1] >= 64 * 64 else (2, 1, 1), pipe)
    if extended:
        ext = extended_candidates(p, arch)
        if p.direction == "forward":
            # the tap bits only take work out of a forward step (H100, session 2: every
            # 3x3 forward winner but one had them): a classic entry whose twin is in the
            # extended list goes, the heuristic pick stays first
            twins = {evolved(c, tap_mask=False) for c in ext if c.tap_mask and c.reduction == "atomic"
                     and not c.stages}
            out = out[:1] + [c for c in out[1:] if c not in twins]
        held = set(out)
        for c in ext:
            if c not in held:
                out.append(c)
    return out


TUNED_DIR = str(Path(__file__).resolve().parent / "tuned")
#: the records of the tables read here: plan facts and split targets are positive numbers, the
#: first-tier classes lists of names, every other table nested lists of sizes and names
_NAME_TOKEN = re.compile(r"[A-Za-z0-9_]{1,40}")
_POSITIVE_KEYS = {"compute_units", "lds_bytes", "warp_size", "default", "depthwise", "flat", "tma",
                  "max_acc_per_thread", "max_channels", "step_us"}


def check_entry(key, v) -> None:
    """One record of the conv tuned tables; ValueError saying what is wrong (see tuned_data.table)."""
    if len(key) != 1 or not isinstance(key[0], str) or not _NAME_TOKEN.fullmatch(key[0]):
        raise ValueError("the key is one name")

    def walk(x, depth):
        if depth > 4:
            raise ValueError("nests deeper than a tile list does")
        if isinstance(x, list):
            if len(x) > 256:
                raise ValueError("a list longer than 256")
            for y in x:
                walk(y, depth + 1)
        elif isinstance(x, bool):
            raise ValueError(f"{x!r} where a size or a name belongs")
        elif isinstance(x, (int, float)):
            if not (math.isfinite(x) and 0 <= x <= 1 << 24):
                raise ValueError(f"{x!r:.30} is not a size in 0..{1 << 24}")
        elif isinstance(x, str):
            if not _NAME_TOKEN.fullmatch(x):
                raise ValueError(f"{x!r:.40} is not a name (letters, digits, '_')")
        else:
            raise ValueError(f"a {type(x).__name__} where a size, a name or a list belongs")

    walk(v, 0)
    if key[0] in _POSITIVE_KEYS and (isinstance(v, (list, str)) or not 0 < v <= 1 << 24):
        raise ValueError(f"{v!r:.40} is not a positive number")


def _lists(name: str, which: str, arch=None) -> tuple:
    """Candidate list ``which`` of tuned table ``name``: the arch's file's, else the generic one's."""
    t = table("conv", arch.name, name, TUNED_DIR, check=check_entry) if arch is not None else EMPTY
    if which not in t:
        t = table("conv", "generic", name, TUNED_DIR, check=check_entry)
    # converted once per loaded table (a reloaded store gives a new table object)
    memo = (name, which)
    got = _LISTS.get(memo)
    if got is None or got[0] is not t:
        got = _LISTS[memo] = (t, as_tuples(t[which]))
    return got[1]


_LISTS: dict = {}


def plan_facts(arch=None) -> tuple[int, int]:
    """(SMs / CUs, shared memory per block in bytes) that the wave and buffer rules plan for:
    ``arch``'s (an ArchSpec), else those of the device the tuned lists were made for."""
    if arch is None:
        arch = _planned_arch(table("conv", "generic", "plan", TUNED_DIR, check=check_entry)["arch"])
    return int(arch.compute_units), int(arch.lds_bytes)


@functools.lru_cache(maxsize=4)
def _planned_arch(name: str):
    from ck_core.errors import ConfigError
    from ck_core.plugins import get_manager

    arch = get_manager().archs().get(name)
    if arch is None:
        raise ConfigError(f"conv's tuned candidate lists were planned for {name}, whose arch plugin is not "
                          f"installed (pip install ck-arch-{name}); pass the ArchSpec of the arch in use")
    return arch


def flat_candidates(p: ConvProblem, arch=None) -> list[ConvKernelConfig]:
    """The im2col kernels over the flattened (tap, channel) axis (``_flat``) for problems with few
    channels per group (RGB / audio stems: C = 1..4, where a per-tap GEMM pads C to 16 and
    re-reads dy or x once per tap); forward and bwd_weight, default and 3x3 specialisations."""
    if p.direction == "bwd_data" or p.c_per_group > int(_lists("flat", "max_channels", arch)) \
            or p.specialization not in ("default", "filter3x3") or p.G > 1 and p.c_per_group == 1:
        return []
    base = heuristic_config(p)
    out = []
    if p.direction == "bwd_weight":
        for t, nw, red in _lists("flat", "bwd_weight", arch):
            c = evolved(base, tile=t, waves=(nw, 1, 1), warp_tile=(16, 16, 16), pipeline="compv3", reduction=red,
                        flat=True, tap_mask=False, stages=0, group_merge=1)
            if c not in out and c.why_not(p) is None:
                out.append(c)
    else:
        for t, nw in _lists("flat", "forward", arch):
            c = evolved(base, tile=t, waves=(nw, 1, 1), warp_tile=(16, 16, 16), pipeline="compv3", flat=True,
                        tap_mask=False, stages=0, group_merge=1, reduction="atomic")
            if c not in out and c.why_not(p) is None:
                out.append(c)
    return out


def extended_candidates(p: ConvProblem, arch=None) -> list[ConvKernelConfig]:
    """Candidates using the realisation knobs, for the layers the classic list serves
    worst (H100, run 6 of PERF_NOTES.md):

    * bwd_weight: ``fixup`` / ``atomicfix`` / ``twostage`` / ``relaxed`` split
      reductions instead of acq_rel atomics + memset + cast; tap bits; BLOCK_K 128 with 4-5 stages;
      merged groups (batched dot) when a group has at most 32 channels.
    * forward 3x3 (at most 31 taps): tap bits on the classic tiles, BLOCK_K 128
      with 4 stages; where the output tiles fill less than two waves (c4
      14x14x256: 98 tiles of 128x128, c5 7x7x512: 100 of 64x128), ``fixup``
      split-K with 64/128/256-wide tiles and 8 warps; below four waves with at
      least 16 reduction steps per tile, ``streamk`` persistent programs.
    * bwd_data: the same on the tap-bit kernel (a stride-1 bwd_data is a forward
      conv of dy with the flipped filter); wider and deeper tiles for 1x1.
    * forward / bwd_data with at most 32 channels per group (resnext g32: 16): gm
      groups per program as one block-diagonal GEMM (``_gm4`` / ``_gm8``).
    * depthwise forward / bwd_data: the flat-row kernel (rows x a contiguous (W, G)
      span per program); forward with stride 1 / dilation 1 in H and W also the
      row-reuse kernel (``_rows``: each input row loaded once per filter column for
      RH output rows).

    Tiles come from the tuned data; waves and buffers are planned for ``arch``'s
    SM count and shared memory (:func:`plan_facts`).
    """
    base = heuristic_config(p)
    plan_sms, plan_smem = plan_facts(arch)
    out: list = []
    held: set = set()
    if base.specialization == "depthwise":
        if p.direction == "bwd_weight":  # the per-tap kernel's bigger tiles, one launch (atomicfix)
            for t, nw in _lists("depthwise_bwd_weight", "atomicfix", arch):
                out.append(evolved(base, tile=t, waves=(nw, 1, 1), reduction="atomicfix"))
        if p.direction != "bwd_weight":  # the flat-row kernel
            for t, nw in _lists("depthwise_flat", "all", arch):
                out.append(evolved(base, tile=t, waves=(nw, 1, 1), flat=True))
        if p.direction == "forward":  # the row-reuse kernel, where it applies
            # at least 8 elements per lane (16-byte fp16 vectors): BLOCK >= 256 * warps
            for t, nw, r in _lists("depthwise_rows", "all", arch):
                c = evolved(base, tile=t, waves=(nw, 1, 1), rows=r)
                if c.why_not(p) is None:
                    out.append(c)
        return out
    m, n, k = p.gemm_mnk
    one_by_one = p.specialization.startswith("filter1x1")
    tap = p.taps <= 31 and not one_by_one
    out += flat_candidates(p, arch)
    held.update(out)

    def add_cfg(tile, waves, pipe="compv3", **kw):
        c = evolved(base, tile=tile, waves=waves, pipeline=pipe, **kw)
        # the A/B buffers the Triton pipeline keeps must fit the arch's shared memory
        smem = (c.tile[0] + c.tile[1]) * c.tile[2] * ELEMENT_BYTES[c.dtype] * c.smem_buffers \
            * (c.group_merge if c.direction == "bwd_weight" else 1)
        if c not in held and c.why_not(p) is None and smem <= plan_smem:
            out.append(c)
            held.add(c)

    if p.direction == "bwd_weight":
        tm = _pow2_at_least(p.k_per_group, 16, 128)
        tn = _pow2_at_least(p.c_per_group, 16, 128)

        def w(a, b):
            return (2, 4, 1) if a * b >= 128 * 64 else (2, 2, 1) if a * b >= 64 * 64 else (1, 2, 1)

        if all(s == 1 for s in p.stride) and p.dtype != "fp32":
            # the tensor-descriptor kernel (TMA boxes of dy and the tap-shifted x)
            spec = "filter1x1_stride1_pad0" if p.specialization == "filter1x1_stride1_pad0" else "default"
            for (a, b, c), nw, st, red in _lists("tma", "bwd_weight", arch):
                a, b = min(a, max(16, tm)), min(b, max(16, tn))
                nw = nw if a * b >= 128 * 64 else 4   # the key space's rule: 8 warps from 128x64 outputs
                add_cfg((a, b, c), (nw, 1, 1), stages=st, reduction=red, tma=True, specialization=spec,
                        tap_mask=False)
        for (a, b, c), st, red in _lists("bwd_weight_split", "all", arch):
            a, b = min(a, tm), min(b, tn)
            add_cfg((a, b, c), w(a, b), stages=st, reduction=red, tap_mask=tap)
        if tap:  # the tap bits alone, on the classic reduction
            add_cfg((min(128, tm), min(64, tn), 64), w(min(128, tm), min(64, tn)), tap_mask=True)
        if p.G > 1 and p.k_per_group <= 32 and p.c_per_group <= 32:
            a, b = max(16, tm), max(16, tn)
            for gm, c in _lists("group_merge", "bwd_weight", arch):
                add_cfg((a, b, c), (2, 2, 1), group_merge=gm, reduction="fixup", tap_mask=tap)
        return out

    def add(tile, waves, pipe="compv3", **kw):
        # the classic list's rule: tiles under 64x64 run on 2 warps
        add_cfg(tile, waves if tile[0] * tile[1] >= 64 * 64 else (2, 1, 1), pipe, **kw)

    bn = _pow2_at_least(n, 16, 128)
    bk = base.tile[2]
    bk2 = 128 if bk >= 64 else bk
    w8 = (2, 4, 1) if bn >= 128 else (2, 2, 1)
    tiles128 = _cdiv(m, 128) * _cdiv(n, 128) * p.G
    few_tiles = tiles128 < 2 * plan_sms
    steps = (1 if one_by_one else p.taps) * _cdiv(p.c_per_group if p.direction == "forward" else p.k_per_group,
                                                  bk)
    # stream-K where the output tiles end in a ragged last wave and each tile has
    # enough reduction steps to share (c3/c4/c5 3x3, c4 1x1 forward)
    streamk = tiles128 < 4 * plan_sms and steps >= 16 and (tap or one_by_one)
    if p.G > 1 and max(p.c_per_group, p.k_per_group) <= 32 and (tap or one_by_one):
        # few channels per group (resnext g32: 16): gm groups as one block-diagonal GEMM,
        # rows of gm*16 contiguous channels, a plain 2-D wgmma (gm x the MMA work, most
        # of it on zeros: these layers are bound by loads and latency, not by MMA)
        red, oth = (p.c_per_group, p.k_per_group) if p.direction == "forward" else (p.k_per_group, p.c_per_group)
        for gm, bm, st in _lists("group_merge", "forward", arch):
            bkg, bng = _pow2_at_least(gm * red, 16, 128), _pow2_at_least(gm * oth, 16, 128)
            if p.G % gm == 0 and bkg % red == 0:
                add((bm, bng, bkg), (2, 4, 1) if bm * bng >= 128 * 128 else (2, 2, 1), "compv3", stages=st,
                    group_merge=gm, tap_mask=tap)
    if p.direction == "forward":
        if tap:
            add(base.tile, base.waves, base.pipeline, tap_mask=True)
            add((128, bn, bk), (2, 4, 1), "compv4", tap_mask=True)
            if not few_tiles:
                add((256, bn, bk), (2, 4, 1), "compv3", tap_mask=True)
            # the classic list's other tiles with the tap bits
            add((64, bn, bk), (2, 2, 1), "compv3", tap_mask=True)
            add((128, bn, bk), (2, 2, 1), "compv3", tap_mask=True)
            add((64, bn, bk2), w8, "compv3", stages=4, tap_mask=True)
            if n >= 256:
                add((128, 256, bk), (2, 4, 1), "compv3", stages=3, tap_mask=True)
                if not few_tiles:
                    add((256, 128, bk), (2, 4, 1), "compv4", tap_mask=True)
        if few_tiles:
            add((128, bn, bk), (2, 4, 1), "compv4", reduction="fixup", tap_mask=tap)
            add((64, bn, bk2), w8, "compv3", stages=4, reduction="fixup", tap_mask=tap)
        if few_tiles and not streamk:  # stream-K balances these better
            add((64, bn, bk), w8, "compv3", reduction="fixup", tap_mask=tap)
            if n >= 256:
                add((64, 256, bk), (2, 4, 1), "compv3", reduction="fixup", tap_mask=tap)
                add((128, 256, bk), (2, 4, 1), "compv3", stages=3, reduction="fixup", tap_mask=tap)
        if streamk:
            add((128, bn, bk), (2, 4, 1), "compv4", reduction="streamk", tap_mask=tap)
            add((64, bn, bk), w8, "compv3", reduction="streamk", tap_mask=tap)
            add((64, bn, bk2), w8, "compv3", stages=4, reduction="streamk", tap_mask=tap)
            if n >= 256:
                add((128, 256, bk), (2, 4, 1), "compv3", stages=3, reduction="streamk", tap_mask=tap)
        return out
    # bwd_data: the tap-bit kernel (no per-step table loads; the forward's pipeline depths)
    if tap:
        add(base.tile, base.waves, base.pipeline, tap_mask=True)
        add((128, bn, bk), (2, 4, 1), "compv3", tap_mask=True)
        add((64, bn, bk), (2, 2, 1), "compv3", tap_mask=True)
        if bn <= 64:  # the session-2 winner's tile on the 64-channel layers (c2 3x3, c3d)
            add((128, bn, bk), (2, 2, 1), "compv3", tap_mask=True)
        add((128, bn, bk), (2, 4, 1), "compv3", stages=4, tap_mask=True)
        add((64, bn, bk2), w8, "compv3", stages=4, tap_mask=True)
        if bn >= 64 and not few_tiles:
            add((256, bn, bk), (2, 4, 1), "compv3", tap_mask=True)
        if n >= 256:
            add((128, 256, bk), (2, 4, 1), "compv3", stages=3, tap_mask=True)
    elif one_by_one and tiles128 < 4 * plan_sms:
        # short reductions (c4 1x1: 256 deep): wider tiles, fewer and deeper steps
        add((128, bn, bk2), (2, 4, 1), "compv3", stages=3)
        if n >= 256:
            add((128, 256, bk), (2, 4, 1), "mem")
            add((256, 128, bk), (2, 4, 1), "compv3", stages=3)
    if few_tiles and (tap or one_by_one):
        if tap:
            add((64, bn, bk2), w8, "compv3", stages=4, reduction="fixup", tap_mask=True)
        if not streamk:
            add((128, bn, bk), (2, 4, 1), "compv3", reduction="fixup", tap_mask=tap)
            add((64, bn, bk), w8, "compv3", reduction="fixup", tap_mask=tap)
    if streamk:
        add((128, bn, bk), (2, 4, 1), "compv3", stages=4, reduction="streamk", tap_mask=tap)
        add((64, bn, bk), w8, "compv3", reduction="streamk", tap_mask=tap)
        add((64, bn, bk2), w8, "compv3", stages=4, reduction="streamk", tap_mask=tap)
        if n >= 256:
            add((128, 256, bk), (2, 4, 1), "compv3", stages=3, reduction="streamk", tap_mask=tap)
    return out


# -- the Dispatcher's shortlist ------------------------------------------------------------

def shortlist(problem, arch, backend: str):
    """Two tiers of keys for ``problem``: its tuning list
    (:func:`ck_conv.heuristics.candidate_configs`: the heuristic pick first, then the classic
    and realisation variants that won on the H100), then the heuristic pick's kernel on
    each tile of CK's table (what a registry of CK's space alone holds).  Each config comes
    with the split that fills ``arch`` (as the launch makes it) and unsplit."""
    if not isinstance(problem, ConvProblem):
        return
    yield _with_splits(candidate_configs(problem, arch=arch), problem, arch, backend)
    yield _with_splits(_ck_table_variants(problem, arch), problem, arch, backend)   # only when the first misses


def _with_splits(cfgs, problem, arch, backend: str) -> list:
    cus, smem = max(int(arch.compute_units or 1), 1), arch.lds_bytes
    out = []
    for c in cfgs:
        if problem.split_k:
            picks = (c if c.split == problem.split_k else evolved(c, split=problem.split_k),)
        else:
            c1 = c if c.split == 1 else evolved(c, split=1)
            sp = preferred_split(c1, problem, cus, smem)
            if sp > 1 and c1.reduction != "streamk":
                sp = split_plan(c1, problem, sp)[0]   # the parts the launch makes
                sp = _enumerated_split(c1, sp, problem)
            # bwd_weight's tensor-descriptor, flat im2col and depthwise kernels are made to be split:
            # their unsplit twins only fill a few SMs (H100 probe: 0.1-0.3x cuDNN, and a ranker
            # that has not seen them may pick them)
            # (the triton key space holds the splits; other backends' spaces only unsplit keys)
            one = sp != 1 and backend == "triton" and c1.direction == "bwd_weight" and (
                c1.tma or c1.flat or c1.specialization == "depthwise")
            picks = (evolved(c1, split=sp),) if one else (evolved(c1, split=sp), c1) if sp != 1 else (c1,)
        out.extend(key_of(x, arch.name, backend) for x in picks)
    return out


def _enumerated_split(c1: ConvKernelConfig, want: int, problem) -> int:
    """The split nearest ``want`` (log scale; the smaller on a tie) among those the enumeration
    gives ``c1`` (:func:`_splits`) that its launch makes as named on ``problem``; 1 if none.
    The preferred split is any integer (263 parts of a MobileNet layer's pixels), the key space
    holds powers of two: a shortlist naming a split outside it would name no key at all."""
    for s in _nearest_first(_splits(c1, ()), want):
        if s == 1 or split_plan(c1, problem, s)[0] == s:
            return s
    return 1


@functools.lru_cache(maxsize=4096)
def _nearest_first(splits: tuple, want: int) -> tuple:
    return tuple(sorted(splits, key=lambda s: (abs(math.log2(s / want)), s)))


def _ck_table_variants(problem, arch) -> list:
    want = heuristic_config(problem)
    facts = conv_facts(arch)
    if want.specialization == "depthwise":
        return [attrs.evolve(want, tile=t) for t in facts["depthwise_tiles"]]
    tiles = facts["tiles"]
    waves = dict.fromkeys((want.waves, (2, 2, 1), (4, 1, 1), (2, 4, 1)))
    return [attrs.evolve(want, tile=tuple(t), waves=w) for t in tiles for w in waves]
