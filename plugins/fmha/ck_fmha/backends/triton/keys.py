"""FMHA on the triton backend: key space, support rules, stage launchers, AOT.

A Triton FMHA key is (family, dtype, head dims) + a Triton configuration
(BLOCK_M, BLOCK_N, warps, stages, variant).  Masks, GQA, soft cap, LSE,
group mode (forward and backward), elementwise bias / ALiBi (with dbias) and
dropout (Philox, bit-exact with ck_fmha.philox; store_randval by a separate
pass) and sink tokens / sink logits (forward) are run-time or JIT-specialised
features of the same kernels.  fwd_appendkv (knew/vnew into contiguous or paged
caches, RoPE on knew and q) has its own kernel; batch_prefill (group-mode queries
over a paged cache: vLLM block table or SGLang page table, linear or vectorized
pages) is the fwd kernel with a page gather.
fp8 (e4m3 with per-tensor descales scale_q/k/v, P scaled onto the fp8 range, o in bf16) is a
dtype of the fwd family (batch and group mode) on archs whose spec lists fp8; the e4m3 flavour
(OCP e4m3fn or CDNA3's e4m3fnuz) comes from :func:`fp8_format`; on NVIDIA the fp8 forward reads V
key-contiguous (:func:`fp8_v_trans`: one transposed copy per call, none for vlayout="c" problems).
On Hopper the fwd family also has Gluon keys (variants :data:`GLUON_VARIANTS`, the warp-specialised
kernel of :mod:`ck_fmha.backends.triton.gluon_fwd`) for fp16/bf16 batch-mode problems (any lengths) with head dims 64/64 or
128/128; they run through ``ops.fwd`` like the Triton keys and build from ``gluon_fwd.aot_source``.
Stages follow the plans of :mod:`ck_fmha.plan`: split-KV main + combine,
backward dot_do_o -> dq_dk_dv -> convert_dq, with tensors passed by name.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import re
from typing import Optional

import attrs

from ck_core.errors import ConfigError, InvalidProblem, MissingKernel
from ck_core.key import KernelKey, RecordSchema

from . import smem

from ...heuristics import (DQ_ATOMIC, dq_gluon, dq_triton, gluon_bwd_reason, gluon_dkdv_reason,  # noqa: F401
                          interpreting, parse_dq)
from .configs import (GLUON_BWD_BLOCK_N, GLUON_BWD_VARIANTS, GLUON_BWD_WARPS, GSPLITS, KVSPLIT,  # noqa: F401
                      fp8_format, fp8_v_trans, hopper as _hopper)

FAMILIES = ("fwd", "fwd_splitkv", "fwd_splitkv_combine", "fwd_pagedkv", "fwd_appendkv", "batch_prefill",
            "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq")
HDIMS = ((32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256))
#: the Gluon sm90 forward's variants: the names of ``ck_fmha.backends.triton.gluon_fwd.GLUON_VARIANTS``, spelled out
#: here because that import brings in torch (tests/test_gluon_fwd.py keeps the two in step)
GLUON_VARIANTS = ("gluon_ws", "gluon_wspp", "gluon_ws_pers", "gluon_wspp_pers")
VARIANTS = ("ptr", "tma", "tma_host", "tma_ws") + GLUON_VARIANTS + GLUON_BWD_VARIANTS + (KVSPLIT,)
#: the variants that take head-dim chunks (a key's ``dchunk``: the forward's head dim in two
#: power-of-two tiles, ``configs.hdim_blocks``)
DCHUNK_VARIANTS = ("ptr", "tma")
CUDA_ONLY = ("tma", "tma_host", "tma_ws") + GLUON_VARIANTS + GLUON_BWD_VARIANTS
#: a backward key's dQ field: ``atomic`` (dQ accumulated in fp32 by the dK/dV kernel: not deterministic;
#: bwd_convert_dq rounds it), ``m<BM>n<BN>w<W>s<S>`` (the Triton dQ pass), ``gluon<BN>s<S>[p]`` (the Gluon
#: dQ pass, p: persistent); empty for every other family

#: what a Gluon key runs: 128 query rows per program (two consumer warpgroups of 64 and a producer
#: warpgroup: 12 warps), head dims q = v
GLUON_BLOCK_M = 128
GLUON_WARPS = 12
GLUON_HDIMS = ((64, 64), (128, 128))
OPTIONS = ("family", "families", "receipt", "dtypes", "hdims")
#: families with fp8 kernels (the forward; split-KV / paged / prefill / backward stay fp16/bf16)
FP8_FAMILIES = ("fwd",)
#: ``fmha_<family>_<dtype>_d<Q>x<V>_m<BM>n<BN>_w<W>_s<S>_<variant>[_c<C>][_g<G>][_k<S>][_dq<...>]`` (docs/plugins.md's
#: grammar); ``fmha_triton_...``, the spelling before the name stopped naming a backend, still parses
#: (recorded selection data holds it)
_NAME = re.compile(r"^fmha_(?:triton_)?(?P<family>[a-z_]+?)_(?P<dtype>fp16|bf16|fp8)_d(?P<hq>\d+)x(?P<hv>\d+)"
                   r"_m(?P<bm>\d+)n(?P<bn>\d+)_w(?P<w>\d+)_s(?P<s>\d+)_(?P<variant>[a-z_]+?)"
                   r"(?:_c(?P<c>\d+))?(?:_g(?P<g>\d+))?(?:_k(?P<k>\d+))?(?:_dq(?P<dq>[a-z0-9]+))?$")
#: a fwd_splitkv key's ``splits`` field: how many key splits it launches (name part ``_k<S>``); the
#: problem's num_splits selects it (the split count the Dispatcher path chose, or the caller's)
SPLITS = tuple(range(1, 129))


@attrs.frozen(cache_hash=True)
class TritonFmhaSig:
    family: str
    dtype: str
    hdim_q: int
    hdim_v: int

    def name_body(self, alg: "TritonFmhaAlg") -> str:
        return format_name(self, alg)


@attrs.frozen(cache_hash=True)
class TritonFmhaAlg:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    variant: str = "ptr"
    dq: str = ""
    splits: int = 0
    #: the forward's head-dim chunk (name part ``_c<C>``; 0: one tile padded to a power of two)
    dchunk: int = 0
    #: the Triton dK/dV kernel's GQA group split (name part ``_g<N>``; 0: none), see :data:`GSPLITS`
    gsplit: int = 0

    def config(self):
        from .configs import TritonFmhaConfig

        return TritonFmhaConfig(self.block_m, self.block_n, self.num_warps, self.num_stages, self.variant,
                                self.dchunk, self.gsplit)


def format_name(sig: TritonFmhaSig, a: TritonFmhaAlg) -> str:
    return (f"fmha_{sig.family}_{sig.dtype}_d{sig.hdim_q}x{sig.hdim_v}_m{a.block_m}n{a.block_n}"
            f"_w{a.num_warps}_s{a.num_stages}_{a.variant}" + (f"_c{a.dchunk}" if a.dchunk else "")
            + (f"_g{a.gsplit}" if a.gsplit else "")
            + (f"_k{a.splits}" if a.splits else "")
            + (f"_dq{a.dq}" if a.dq else ""))


def parse_name(body: str):
    m = _NAME.match(body)
    if not m or m["family"] not in FAMILIES or m["variant"] not in VARIANTS:
        raise MissingKernel(f"{body!r} is not a Triton FMHA kernel name "
                            f"(fmha_<family>_<dtype>_d<Q>x<V>_m<BM>n<BN>_w<W>_s<S>_<variant>)")
    try:
        return from_fields(dict(family=m["family"], dtype=m["dtype"], hdim_q=int(m["hq"]), hdim_v=int(m["hv"])),
                           dict(block_m=int(m["bm"]), block_n=int(m["bn"]), num_warps=int(m["w"]),
                                num_stages=int(m["s"]), variant=m["variant"], dq=m["dq"] or "",
                                splits=int(m["k"] or 0), dchunk=int(m["c"] or 0), gsplit=int(m["g"] or 0)))
    except ConfigError as exc:
        raise MissingKernel(f"{body!r}: {exc}") from None


DTYPES = ("fp16", "bf16", "fp8")


_SIG = RecordSchema(TritonFmhaSig, what="Triton FMHA signature", choices={"family": FAMILIES, "dtype": DTYPES},
                    bounds={"hdim_q": (1, 1024), "hdim_v": (1, 1024)})
_ALG = RecordSchema(TritonFmhaAlg, what="Triton FMHA algorithm", choices={"variant": VARIANTS},
                    bounds={"block_m": (1, 1024), "block_n": (1, 1024), "num_warps": (1, 64),
                            "num_stages": (1, 16), "splits": (0, SPLITS[-1]), "dchunk": (0, 256),
                            "gsplit": (0, GSPLITS[-1])})


def from_fields(sig: dict, alg: dict):
    """Signature and algorithm of untrusted JSON field dicts, every field checked."""
    return _SIG(sig), _ALG(alg)


def legal(key, arch) -> Optional[str]:
    """Why the enumeration rules would not produce ``key`` on ``arch`` (or None)."""
    s, a = key.signature, key.algorithm
    if s.dtype not in arch.dtypes or (s.dtype == "fp8" and s.family not in FP8_FAMILIES):
        return f"no Triton {s.family} kernel in {s.dtype} on {arch.name}"
    if (s.hdim_q, s.hdim_v) not in HDIMS and not _any_hdims_ok(s.hdim_q, s.hdim_v):
        return (f"head dims {s.hdim_q}/{s.hdim_v} are not among the Triton kernels' {HDIMS} (nor multiples "
                "of 8 up to 256, which the public API enumerates per problem)")
    if a.variant in CUDA_ONLY and not _hopper(arch):
        return f"variant {a.variant} runs on Hopper only"
    if a.variant in GLUON_VARIANTS and ((s.hdim_q, s.hdim_v) not in GLUON_HDIMS or s.dtype == "fp8"):
        return f"the Gluon kernel covers fp16/bf16 head dims {GLUON_HDIMS} only"
    if (a.variant in GLUON_BWD_VARIANTS + (KVSPLIT,)) != (s.family == "bwd_dq_dk_dv" and a.variant != "ptr"):
        return f"variant {a.variant} is not a {s.family} kernel"
    if a.dchunk:
        from .configs import valid_dchunk

        fwd_ok = s.family == "fwd" and a.variant in DCHUNK_VARIANTS
        bwd_ok = s.family == "bwd_dq_dk_dv" and a.variant in ("ptr", KVSPLIT) and not a.dq.startswith("gluon")
        if not (fwd_ok or bwd_ok) or s.dtype == "fp8":
            return (f"head-dim chunks (_c{a.dchunk}) belong to fp16/bf16 fwd keys of the variants "
                    f"{'/'.join(DCHUNK_VARIANTS)} and to bwd_dq_dk_dv keys of the Triton kernels (ptr / {KVSPLIT}, "
                    "Triton or atomic dQ)")
        if not valid_dchunk(a.dchunk) or a.dchunk >= max(s.hdim_q, s.hdim_v):
            return (f"head-dim chunk {a.dchunk} must be a power of two from 16 below the head dims "
                    f"{s.hdim_q}/{s.hdim_v}")
    if a.gsplit and (s.family != "bwd_dq_dk_dv" or a.variant not in ("ptr", KVSPLIT) or a.gsplit not in GSPLITS):
        return (f"the group split _g{a.gsplit} belongs to bwd_dq_dk_dv keys of the Triton dK/dV kernel "
                f"(ptr / {KVSPLIT}), one of {GSPLITS}")
    if a.variant == KVSPLIT and a.dq and parse_dq(a.dq)[0] == "gluon":
        return "the kvsplit dK/dV kernel pairs with the Triton dQ pass or atomics"
    if (s.family == "bwd_dq_dk_dv") != bool(a.dq):
        return "the dq field belongs to bwd_dq_dk_dv keys (and they need one)"
    if (s.family == "fwd_splitkv") != bool(a.splits):
        return "the splits field belongs to fwd_splitkv keys (and they need one)"
    if a.dq:
        try:
            dq = parse_dq(a.dq)
        except ValueError as exc:
            return str(exc)
        if (dq[0] == "gluon" or a.variant in GLUON_BWD_VARIANTS) and (
                (s.hdim_q, s.hdim_v) not in GLUON_HDIMS or s.dtype == "fp8" or not _hopper(arch)):
            return f"the Gluon backward kernels cover fp16/bf16 head dims {GLUON_HDIMS} on Hopper only"
    if smem.measured(arch):
        return smem_reason(key, arch)
    need = smem.tile_sum(s.family, s.hdim_q, s.hdim_v, a, 1 if s.dtype == "fp8" else 2)
    if need > arch.lds_bytes and a not in _tabled(s.family, s.hdim_q, s.hdim_v, arch.name, s.dtype == "fp8"):
        return f"needs {need} B of shared memory/LDS, {arch.name} has {arch.lds_bytes} B"
    return None


def _any_hdims_ok(hq: int, hv: int) -> bool:
    """Head dims the kernels take (specialised per value, tiles padded to a power of two)."""
    return all(isinstance(d, int) and 8 <= d <= 256 and d % 8 == 0 for d in (hq, hv))


def _arch_spec(name: str):
    """The ArchSpec of an arch name from the plugin manager, or None."""
    try:
        from ck_core.plugins import get_manager

        return get_manager().archs().get(name)
    except Exception:  # pragma: no cover - no manager / plugin errors: fall back to OCP fp8
        return None


def smem_reason(key, arch, bias: bool = False) -> Optional[str]:
    """Why ``key``'s kernels do not fit ``arch``'s shared memory / LDS (None when they do)."""
    return _smem_reason(key, arch.name, arch.lds_bytes, bias)


@functools.lru_cache(maxsize=8192)
def _smem_reason(key, arch_name: str, limit: int, bias: bool) -> Optional[str]:
    s = key.signature
    needs = smem.kernel_needs(s.family, s.hdim_q, s.hdim_v, key.algorithm, 1 if s.dtype == "fp8" else 2, bias)
    kernel, need = max(needs.items(), key=lambda kv: kv[1])
    if need <= limit:
        return None
    return (f"its {kernel} kernel needs {need} B of shared memory/LDS{' with the elementwise bias' if bias else ''}; "
            f"{arch_name} has {limit} B per block (a smaller tile or fewer stages fits)")


def _shrink_cfg(bm: int, bn: int, stages: int):
    """The next smaller tiling: one pipeline stage fewer, else the larger block halved (to 16)."""
    if stages > 1:
        return bm, bn, stages - 1
    if max(bm, bn) <= 16:
        return None
    return (bm // 2, bn, stages) if bm >= bn else (bm, bn // 2, stages)


def _fitted(family, hq, hv, a: TritonFmhaAlg, elem_bytes: int, limit: int) -> Optional[TritonFmhaAlg]:
    """``a``, or the nearest smaller tiling of it whose kernels fit ``limit`` bytes of shared memory
    (a tuned tile measured on a larger arch, or a head dim whose tile the tables do not size), or None.
    Gluon kernels keep their tiles (their layouts are written for them)."""
    for _ in range(16):
        needs = smem.kernel_needs(family, hq, hv, a, elem_bytes)
        if max(needs.values()) <= limit:
            return a
        if a.variant in GLUON_VARIANTS:
            return None
        if needs.get("dq", 0) > limit:   # the backward's Triton dQ pass
            dq = parse_dq(a.dq)
            if dq[0] != "triton":
                return None
            c = dq[1]
            smaller = _shrink_cfg(c.BLOCK_M, c.BLOCK_N, c.num_stages)
            if smaller is None:
                return None
            a = attrs.evolve(a, dq=dq_triton(c.with_(BLOCK_M=smaller[0], BLOCK_N=smaller[1], num_stages=smaller[2])))
            continue
        if a.variant in GLUON_BWD_VARIANTS:
            return None
        smaller = _shrink_cfg(a.block_m, a.block_n, a.num_stages)
        if smaller is None:
            return None
        a = attrs.evolve(a, block_m=smaller[0], block_n=smaller[1], num_stages=smaller[2])
    return None


def _configs(family, hq, hv, arch, elem_bytes: int = 2, prune: bool = True) -> list:
    from . import configs as C
    from ... import heuristics as T

    tag = arch.name   # the arch's tuned tables (the generic ones where it has none)
    extras = ()
    if family == "bwd_dq_dk_dv":
        return _bwd_algs(hq, hv, arch, tag, elem_bytes, prune)
    if family == "fwd":
        # every tile the tables name (per causal-ness and length bucket), each with its lesser TMA
        # forms: what the heuristic can pick for any problem the better form cannot address
        cands = [T.default_fwd_config(hq, hv, tag, causal=c, seqlen=n, gluon=False)
                 for c in (False, True) for n in T.SEQ_BUCKETS]
        lesser = {"tma_host": ("tma", "ptr"), "tma": ("ptr",), "tma_ws": ("ptr",)}
        if elem_bytes == 2 and T.fwd_dchunk(hq, hv, tag) and _hopper(arch):
            # head dims the arch runs in chunks: the measured chunked tiles only (their device-descriptor
            # form addresses every fp16/bf16 problem of these head dims): the learned ranker, fitted on
            # padded tiles, then picks among measured winners
            lesser = {"tma_host": ("tma",)}
        else:
            extras = (C.TritonFmhaConfig(128, 64, 4, 3, "ptr"), C.TritonFmhaConfig(64, 64, 4, 2, "ptr"))
            cands += [c for c in extras if c not in cands]
        if elem_bytes == 1:
            cands.insert(0, T.default_fwd_config(hq, hv, tag, fp8=True))
        cands = [x for c in cands for x in (c, *(c.with_(variant=v) for v in lesser.get(c.variant, ())))]
        if _hopper(arch) and elem_bytes == 2 and (hq, hv) in GLUON_HDIMS:
            cands += T.gluon_fwd_configs(hq, tag)   # the Gluon kernel's tuned tiles
    elif family == "batch_prefill":  # the fwd kernel with a page gather: pointer loads only
        cands = [T.default_fwd_config(hq, hv, "generic").with_(variant="ptr"),
                 C.TritonFmhaConfig(64, 64, 4, 2, "ptr")]
    elif family in ("fwd_splitkv", "fwd_pagedkv"):
        cands = [T.default_splitkv_config(hq, hv, 1, tag), T.default_splitkv_config(hq, hv, 64, tag)]
    elif family == "fwd_appendkv":  # a copy kernel: BLOCK_M rows per program, BLOCK_N unused
        cands = [C.TritonFmhaConfig(32, 16, 4, 1, "ptr")]
    else:  # combine, dot_do_o, convert_dq: one small elementwise kernel each
        cands = [C.TritonFmhaConfig(64, 64, 4, 1, "ptr")]
    out = []
    for c in cands:
        if c.variant in GLUON_VARIANTS and not _hopper(arch):
            continue   # a Hopper kernel: no pointer form to fall back to
        v = c.variant if (_hopper(arch) or c.variant not in CUDA_ONLY) else "ptr"
        chunk = c.DCHUNK if (family == "fwd" and v in DCHUNK_VARIANTS and elem_bytes == 2) else 0
        a = TritonFmhaAlg(c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages, v, dchunk=chunk)
        if prune and smem.measured(arch):
            a = _fitted(family, hq, hv, a, elem_bytes, arch.lds_bytes)
        elif prune:   # (see smem.tile_sum: the tables' tiles are kept where the estimate is not measured)
            tabled = family in ("fwd", "bwd_dq_dk_dv") and c not in extras
            a = a if tabled or smem.tile_sum(family, hq, hv, a, elem_bytes) <= arch.lds_bytes else None
        if a is not None and a not in out:
            out.append(a)
    if family == "fwd_splitkv":   # one key per split count: the count is in the kernel's name
        return [attrs.evolve(a, splits=n) for a in out for n in SPLITS]
    return out


def _bwd_algs(hq, hv, arch, tag, elem_bytes, prune=True) -> list:
    """Backward keys: each tuned dK/dV tile (Triton; on Hopper also the Gluon tiles) with each dQ
    choice (atomic, the tuned Triton dQ tiles, on Hopper the Gluon dQ tiles)."""
    from . import gluon_bwd
    from ... import heuristics as T

    pairs = [T.default_bwd_configs(hq, hv, tag, causal=c) for c in (False, True)]
    kv = [(c.BLOCK_M, c.BLOCK_N, c.num_warps, c.num_stages, c.variant if c.variant == KVSPLIT else "ptr")
          for c, _ in pairs]
    chunk = {k: c.DCHUNK for k, (c, _) in zip(kv, pairs) if elem_bytes == 2}   # the tables' head-dim chunks
    dqs = [DQ_ATOMIC] + [dq_triton(q) for _, q in pairs]
    if _hopper(arch) and elem_bytes == 2 and (hq, hv) in GLUON_HDIMS:
        d = hq
        tiles = ([T.gluon_dkdv_tile(d, c, tag) for c in (False, True)]
                 + [T.gluon_fused_tile(d, c, tag) for c in (False, True)])
        tiles += [gluon_bwd.tiles("dkdv", tag).get(d), gluon_bwd.tiles("fused", tag).get(d)]
        kv += [(t[0], GLUON_BWD_BLOCK_N, GLUON_BWD_WARPS, t[1], "gluon_dkdv_pers" if t[2] else "gluon_dkdv")
               for t in tiles if t is not None]
        dqs += [dq_gluon(t) for t in (T.gluon_dq_tile(d, tag), gluon_bwd.tiles("dq", tag).get(d)) if t is not None]
    out = []
    kv = [(*k, 0) for k in kv] + [(*k, n) for k in kv if k[4] in ("ptr", KVSPLIT) for n in GSPLITS]
    for *k, gs in kv:
        for dq in dqs:
            c = chunk.get(tuple(k), 0) if not dq.startswith("gluon") else 0
            a = TritonFmhaAlg(*k, dq=dq, gsplit=gs, dchunk=c)
            if prune and smem.measured(arch):   # a tile too large for the arch: its nearest smaller form
                a = _fitted("bwd_dq_dk_dv", hq, hv, a, elem_bytes, arch.lds_bytes)
            elif prune and k[4] not in ("ptr", KVSPLIT):   # (the tables' Triton tiles: see smem.tile_sum)
                a = a if smem.tile_sum("bwd_dq_dk_dv", hq, hv, a, elem_bytes) <= arch.lds_bytes else None
            if a is not None and a not in out and legal_pair(a):
                out.append(a)
    return out


def legal_pair(a: TritonFmhaAlg) -> bool:
    """Whether a backward key's dK/dV variant goes with its dQ field (kvsplit: not the Gluon dQ pass)."""
    return not (a.variant == KVSPLIT and a.dq and a.dq.startswith("gluon"))


@functools.lru_cache(maxsize=None)
def _tabled(family, hq, hv, arch_name, fp8) -> frozenset:
    """The algorithms the arch's tuned tables name: on archs where :func:`smem.tile_sum` (an upper
    bound there) stands in for a measured estimate, the launchers ran them before it existed, so it
    prunes only the generic extras."""
    arch = _arch_spec(arch_name)
    if arch is None or family not in ("fwd", "bwd_dq_dk_dv"):
        return frozenset()
    return frozenset(_configs(family, hq, hv, arch, 1 if fp8 else 2, prune=False))


def enumerate_keys(arch, backend: str, options: dict) -> list:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown fmha option(s) for Triton kernels: {', '.join(unknown)}; "
                          f"known: {', '.join(OPTIONS)}")
    fams = options.get("families") or options.get("family") or FAMILIES
    fams = [fams] if isinstance(fams, str) else list(fams)
    bad = [f for f in fams if f not in FAMILIES]
    if bad:
        raise ConfigError(f"the Triton FMHA kernels have no family {bad}; they cover {', '.join(FAMILIES)}")
    dtypes = options.get("dtypes") or ("fp16", "bf16", "fp8")
    dtypes = [dtypes] if isinstance(dtypes, str) else dtypes
    keys = []
    for fam in fams:
        for dt in dtypes:   # Triton kernels: fp16, bf16; fp8 for the FP8_FAMILIES (others: no keys)
            if (dt not in arch.dtypes or dt not in ("fp16", "bf16", "fp8")
                    or (dt == "fp8" and fam not in FP8_FAMILIES)):
                continue
            for hq, hv in options.get("hdims") or HDIMS:
                for a in _configs(fam, hq, hv, arch, 1 if dt == "fp8" else 2):
                    keys.append(KernelKey("fmha", TritonFmhaSig(fam, dt, hq, hv), a, arch.name, backend))
    return keys


def supports(key, p) -> Optional[str]:
    s = key.signature
    if p.dtype == "fp8" and p.family not in FP8_FAMILIES:
        return (f"the Triton fp8 kernels cover the {'/'.join(FP8_FAMILIES)} family (batch and group mode); "
                f"run {p.family} in fp16/bf16")
    if s.family != p.family:
        return f"kernel family {s.family}, problem {p.family}"
    if s.dtype != p.dtype:
        if p.dtype == "fp8":
            return (f"kernel dtype {s.dtype}, problem fp8 (fp8 kernels are enumerated only on archs whose "
                    f"spec lists fp8, e.g. sm90, gfx942, gfx950, gfx1201)")
        return f"kernel dtype {s.dtype}, problem {p.dtype}"
    if p.dtype == "fp8" and (p.bias != "none" or p.p_drop > 0):
        return "the Triton fp8 forward has no bias or dropout"
    if (s.hdim_q, s.hdim_v) != (p.hdim_q, p.hdim_v):
        return f"kernel head dims {s.hdim_q}/{s.hdim_v}, problem {p.hdim_q}/{p.hdim_v}"
    why = _smem_unsupported(key, p.bias == "elementwise")
    if why:
        return why
    a = key.algorithm
    if a.splits and a.splits != p.num_splits:
        return f"the key runs {a.splits} key splits, the problem asks for {p.num_splits}"
    if a.variant in GLUON_VARIANTS:
        return _gluon_unsupported(a, p)
    why = (_bwd_unsupported(a, p) if p.family == "bwd_dq_dk_dv" else
           _tma_unsupported(a.variant, p) if a.variant in ("tma", "tma_ws", "tma_host") else None)
    if why:
        return why
    if p.family == "fwd_appendkv":
        return None   # contiguous or paged caches, both RoPE forms; no attention features apply
    if p.family == "batch_prefill":
        if p.store_randval:
            return "store_randval is not implemented for the Triton batch_prefill (dropout itself is)"
        if p.skip_min_seqlen_q:
            return "skip_min_seqlen_q is not implemented by the Triton kernels"
        return None   # group mode, both lookups, linear and vectorized pages, masks/softcap/bias/dropout/sinks
    split = p.family in ("fwd_splitkv", "fwd_splitkv_combine", "fwd_pagedkv")
    if p.bias != "none" and split:
        return "the Triton split-KV / paged kernels have no bias (the Triton fwd and backward have)"
    if p.p_drop > 0 and split:
        return "the Triton split-KV / paged kernels have no dropout"
    if (p.sink_tokens or p.sink_logits) and p.family.startswith("bwd"):
        return "the Triton backward kernels have no sink tokens"
    if p.skip_min_seqlen_q:
        return "skip_min_seqlen_q is not implemented by the Triton kernels"
    if p.vlayout != "r" and not (p.dtype == "fp8" and p.family == "fwd"):
        return "the Triton kernels read V row-major only (column-major V: the fp8 forward)"
    if p.is_group and split:
        return "split-KV / paged decode runs in batch mode on the Triton kernels"
    if p.seqlens_k is not None and not (split or p.is_group):
        return ("per-batch logical seqlens_k is implemented by the Triton split-KV / paged kernels and in group "
                "mode (fwd, backward); batch-mode fwd/backward take one seqlen_k")
    return None


def _smem_unsupported(key, bias: bool) -> Optional[str]:
    """:func:`smem_reason` on the arch of ``key`` (keys from a file or a tuning store were not
    enumerated for it); None where no arch plugin describes it."""
    arch = _arch_spec(key.arch)
    return smem_reason(key, arch, bias) if arch is not None and smem.measured(arch) else None


def _tma_unsupported(variant: str, p) -> Optional[str]:
    """Why a TMA form cannot address ``p``'s tensors (contiguous and 16-byte aligned, as the public
    API and the launcher hand them over)."""
    es = 1 if p.dtype == "fp8" else 2
    if any(d * es % 16 or d * es < 16 for d in (p.hdim_q, p.hdim_v)):
        return f"{variant}: rows of head dims {p.hdim_q}/{p.hdim_v} are not whole 16-byte units (use ptr)"
    if p.family != "fwd":
        return f"{variant} is a forward form"
    v_trans = p.dtype == "fp8"
    if v_trans and p.is_group:
        # group mode + key-contiguous V through device descriptors raised "illegal instruction" on the
        # H100 (benchmarks/fp8_layout_debug.py, 2026-11-22); pointer loads of that layout are correct
        return f"{variant}: the fp8 group-mode forward reads V by pointer"
    if v_trans and p.vlayout == "c" and (p.seqlen_k or 0) * es % 16:
        return f"{variant}: a column-major V of {p.seqlen_k} keys has rows that are not 16-byte units"
    if variant == "tma_host":
        if p.is_group:
            return "tma_host (descriptors over the flattened batch) runs batch mode only"
        if any(d & (d - 1) or d < 16 for d in (p.hdim_q, p.hdim_v)):
            return f"tma_host needs power-of-two head dims, got {p.hdim_q}/{p.hdim_v}"
    return None


def _bwd_unsupported(a: TritonFmhaAlg, p) -> Optional[str]:
    """Why a backward key (dK/dV kernel + dQ choice) cannot run ``p``."""
    if not a.dq:
        return "a bwd_dq_dk_dv key needs a dq field"
    dq = parse_dq(a.dq)
    if dq[0] == DQ_ATOMIC and p.deterministic:
        return "dQ by fp32 atomics is not deterministic (deterministic=True needs a separate dQ pass)"
    if dq[0] == "gluon":
        why = gluon_bwd_reason(p, dq[1][0])
        if why:
            return f"the Gluon dQ pass: {why}"
    if a.variant in GLUON_BWD_VARIANTS:
        why = gluon_dkdv_reason(p, a.block_m, dq[0] == DQ_ATOMIC)
        if why:
            return f"the Gluon dK/dV kernel: {why}"
    if a.gsplit and a.gsplit > p.nhead_q // max(1, p.nhead_k):
        return (f"the key splits a GQA group over {a.gsplit} programs; the problem's group has "
                f"{p.nhead_q // max(1, p.nhead_k)} query heads")
    return None


def _gluon_unsupported(a: TritonFmhaAlg, p) -> Optional[str]:
    """Why a Gluon key cannot run ``p`` (None when it can): batch-mode fwd, fp16/bf16, head dims 64/64 or
    128/128, plain or causal attention (causal with seqlen_q == seqlen_k), any lengths, nothing else."""
    g = f"the Gluon sm90 forward ({a.variant})"
    if p.family != "fwd":
        return f"{g} is a fwd kernel, not {p.family}"
    if a.block_m != GLUON_BLOCK_M or a.num_warps != GLUON_WARPS:
        return f"{g} runs BLOCK_M={GLUON_BLOCK_M} with {GLUON_WARPS} warps; this key has {a.block_m}/{a.num_warps}"
    if p.is_group:
        return f"{g} runs batch mode only (group mode / varlen: the Triton kernels)"
    if p.dtype not in ("fp16", "bf16"):
        return f"{g} takes fp16/bf16, not {p.dtype}"
    if (p.hdim_q, p.hdim_v) not in GLUON_HDIMS:
        return f"{g} takes head dims 64/64 or 128/128, not {p.hdim_q}/{p.hdim_v}"
    if p.bias != "none":
        return f"{g} has no bias or ALiBi"
    if p.p_drop > 0 or p.store_randval:
        return f"{g} has no dropout"
    if p.logits_soft_cap > 0:
        return f"{g} has no logits soft cap"
    if p.has_window and not p.is_causal:
        return f"{g} has no sliding-window / local masks (plain or causal attention only)"
    if p.sink_tokens or p.sink_logits:
        return f"{g} has no sink tokens or sink logits"
    if p.vlayout != "r":
        return f"{g} reads V row-major only"
    if p.paged_kv or p.seqlens_k is not None:
        return f"{g} reads contiguous K/V of one length (no paged KV, no per-batch seqlens_k)"
    if not p.seqlen_q or not p.seqlen_k:   # (any lengths: ragged last blocks are masked in the kernel)
        return f"{g} needs seqlen_q and seqlen_k > 0, got {p.seqlen_q}/{p.seqlen_k}"
    if p.is_causal and p.seqlen_q != p.seqlen_k:
        return f"{g} is causal only with seqlen_q == seqlen_k (got {p.seqlen_q}/{p.seqlen_k})"
    return None


def rank(problem, candidates: list, arch) -> list:
    """The tuned tables' choice first (:func:`ck_fmha.heuristics.rank`), then by tile size."""
    from ...heuristics import rank as _rank

    def fit(kv, dq, dchunk):   # the enumeration's form of the tables' backward tile (see _bwd_algs)
        if kv[4] in GLUON_BWD_VARIANTS:
            return kv, dq
        a = _fitted("bwd_dq_dk_dv", problem.hdim_q, problem.hdim_v, TritonFmhaAlg(*kv, dq=dq, dchunk=dchunk),
                    1 if problem.dtype == "fp8" else 2, arch.lds_bytes)
        return (kv, dq) if a is None else ((a.block_m, a.block_n, a.num_warps, a.num_stages, a.variant), a.dq)

    return _rank(problem, candidates, arch, fit if smem.measured(arch) else None)


# -- launchers ----------------------------------------------------------------------------

def _mask(p) -> dict:
    if p.mask == "none":
        return {"causal": False, "window": (-1, -1), "align": "top_left"}
    align = "bottom_right" if p.mask == "bottom_right" else "top_left"
    return {"causal": False, "window": (p.window_left, p.window_right), "align": align}


def _alibi_align(p) -> str:
    """Which ALiBi form the reference uses for this mask (ck_fmha.masks.alibi_bias)."""
    if p.is_causal:
        return "vertical"
    return "top_left" if p.mask in ("top_left", "generic") else "bottom_right"


def _features(p, t, tdt) -> dict:
    """Bias / ALiBi / dropout keyword arguments of ops.fwd / ops_bwd.bwd_dq_dk_dv from the problem."""
    kw = {}
    if p.bias == "elementwise":
        kw["bias"] = _as_kernel_dtype(p, "bias", t["bias"], tdt)
    elif p.bias == "alibi":
        kw["alibi_slopes"] = t["alibi_slopes"]
        kw["alibi_align"] = _alibi_align(p)
    if p.p_drop > 0:
        kw.update(dropout_p=p.p_drop, seed=p.seed, offset=p.offset)
    return kw


def _sinks(p, t) -> dict:
    """Sink-token / sink-logit keyword arguments of the Triton forwards."""
    kw = {}
    if p.sink_tokens:
        kw["sink_tokens"] = p.sink_tokens
    if p.sink_logits:
        kw["sink"] = t["sink"]
    return kw


def _torch_dtype(token, arch_name: Optional[str] = None):
    """torch dtype of a key's data; fp8 is the arch's e4m3 flavour (:func:`fp8_format`)."""
    import torch

    if token == "fp8":
        fmt = fp8_format(_arch_spec(arch_name) if arch_name else None)
        return {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[fmt]
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[token]


def kernel_via(key, capture: Optional[list] = None):
    """How the launcher of ``key`` launches a Triton kernel (``ops``' ``_via``): through
    :mod:`ck_core.backends.triton_artifacts` as cache entry ``<key name>/<kernel name>``, the
    entry ``ck build`` writes; with ``capture``, the launch is appended to it as
    ``(suffix, fn, args, kwargs)`` instead (:func:`jit_calls`)."""
    from ck_core.backends import triton_artifacts

    from . import warm

    def via(fn, grid):
        suffix = "/" + getattr(fn, "__name__", type(fn).__name__)   # (tests wrap kernels in spies)
        if capture is not None:
            return lambda *args, **kwargs: capture.append((suffix, fn, args, kwargs))
        launch = triton_artifacts.bind(key.name + suffix, fn, grid, triton_artifacts.compile_options(key))
        return warm.wrap(fn, grid, launch)   # (recorded inside warm.recording())

    return via


def make_launcher(key, capture: Optional[list] = None):
    """Stage launcher for one key: ``(problem, tensors) -> {name: tensor}`` on torch tensors.
    ``capture``: see :func:`kernel_via`."""
    import torch

    from ... import plan as stages
    from ...device_errors import guard_offsets
    from . import launch as ops
    from . import launch_bwd as ops_bwd
    from . import launch_decode as ops_dec

    via = kernel_via(key, capture)
    fam = key.signature.family
    alg = key.algorithm
    cfg = alg.config()
    tdt = _torch_dtype(key.signature.dtype, key.arch)
    device_cache: dict = {}

    def dev_int32(p, name, values, like):
        """Host-side problem data uploaded once per problem (never read back: no host sync)."""
        k = (p, name)
        t = device_cache.get(k)
        if t is None:
            t = torch.tensor(values, dtype=torch.int32, device=like.device)
            device_cache[k] = t
        return t

    def lens(p, like):
        """Group mode's logical key lengths (shorter than the seqstart_k spans), when given."""
        return {} if p.seqlens_k is None else {"seqlens_k": dev_int32(p, "lens", p.seqlens_k, like)}

    def cast(p, t, names):
        """The named tensors in the key's dtype (see :func:`_as_kernel_dtype`)."""
        return {n: _as_kernel_dtype(p, n, t[n], tdt) for n in names if n in t}

    v_trans = fp8_v_trans(_arch_spec(key.arch)) if key.signature.dtype == "fp8" else None

    def fwd(p, t):
        x = cast(p, t, ("q", "k", "v"))
        layout, kw = p.layout, {}
        v = x["v"]
        if p.vlayout == "c":   # [B, Hk, Dv, Sk] / [Hk, Dv, Tk]: the same data as a key-contiguous V view
            v = v.permute(2, 0, 1) if p.is_group else (v.transpose(2, 3) if p.layout == "bhsd"
                                                        else v.permute(0, 3, 1, 2))
        layout, kw, bad = varlen(p, t, x["q"])
        if p.dtype == "fp8":   # per-tensor descales from the problem; o in bf16 (stages._store)
            kw.update(q_descale=p.scale_q, k_descale=p.scale_k, v_descale=p.scale_v, out_dtype=torch.bfloat16,
                      fp8_v_trans=v_trans)
        o, lse = ops.fwd(x["q"], x["k"], v, scale=p.softmax_scale, softcap=p.logits_soft_cap,
                         return_lse=True, layout=layout, config=cfg, **_mask(p), **kw, **_features(p, t, tdt),
                         **_sinks(p, t), _via=via)
        ops._poison(bad, o, lse)
        out = {"o": o, "lse": lse}
        if p.store_randval:
            out["randval"] = ops.dropout_randval(
                p.batch, p.nhead_q, p.seqlen_q, p.seqlen_k, dropout_p=p.p_drop, seed=p.seed, offset=p.offset,
                device=o.device, cu_seqlens_q=kw.get("cu_seqlens_q"), cu_seqlens_k=kw.get("cu_seqlens_k"),
                total_q=p.total_q, seqlens_k=kw.get("seqlens_k"))
        return out

    def _kv(p, t):
        if p.paged_kv:
            x = cast(p, t, ("k_cache", "v_cache"))
            kc, vc = x["k_cache"], x["v_cache"]
            if p.layout == "bhsd":   # [pages, Hk, P, D]
                page_size, hk = kc.shape[2], kc.shape[1]
                kvs = (kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2))
            else:                    # [pages, P, Hk, D]
                page_size, hk = kc.shape[1], kc.shape[2]
                kvs = (kc.stride(0), kc.stride(2), kc.stride(1), vc.stride(0), vc.stride(2), vc.stride(1))
            bt = t["block_table"]
            return kc, vc, dict(page_size=page_size, block_table=bt.to(dtype=torch.int32),
                                max_seqlen_k=p.seqlen_k if p.runtime_seqlens_k else max(p.seqlens_k),
                                kv_strides=kvs, hk=hk)
        x = cast(p, t, ("k", "v"))
        k, v = ops._last_contig(x["k"]), ops._last_contig(x["v"])
        _, hk, sk, _ = ops._dims(k, p.layout)
        kvs = ops._bhs_strides(k, p.layout) + ops._bhs_strides(v, p.layout)
        return k, v, dict(page_size=0, block_table=None, max_seqlen_k=sk, kv_strides=kvs, hk=hk)

    def splitkv_main(p, t):
        q = cast(p, t, ("q",))["q"]
        k, v, kw = _kv(p, t)
        if p.runtime_seqlens_k:   # this step's lengths, on the device: read by the kernel, never by the host
            seqlens = t["seqlens_k"]
        else:
            seqlens = dev_int32(p, "lens", p.seqlens_k, q) if p.seqlens_k else None
        # one split (the plan's one stage, or fwd_pagedkv): the kernel writes o and lse itself
        direct = p.num_splits == 1 and (alg.splits or 1) == 1
        oacc, lacc = ops_dec._splitkv_main(q, k, v, seqlens_k=seqlens, scale=p.softmax_scale,
                                       softcap=p.logits_soft_cap, num_splits=alg.splits or 1, layout=p.layout,
                                       config=cfg, **_mask(p), **kw, **_sinks(p, t), _via=via, direct=direct)
        return {"o": oacc, "lse": lacc} if direct else {"o_acc": oacc, "lse_acc": lacc}

    def combine(p, t):
        q = cast(p, t, ("q",))["q"]
        o, lse = ops_dec.splitkv_combine(t["o_acc"], t["lse_acc"], q, layout=p.layout, return_lse=True, _via=via)
        return {"o": o, "lse": lse}

    def pagedkv(p, t):
        out = splitkv_main(p, t)
        return out if "o" in out else combine(p, dict(t, **out))

    def offsets(p, t, name, like):
        """Group-mode offsets on the device: the problem's (validated by it: R14, R18, R21), or the
        caller's run-time tensor clamped by :func:`~ck_fmha.device_errors.guard_offsets` (with the
        device flag of its changes).  No host synchronisation either way."""
        if not p.runtime_seqstarts:
            return dev_int32(p, name, p.seqstart_q if name == "sq" else p.seqstart_k, like), None
        cu = t["cu_seqlens_q" if name == "sq" else "cu_seqlens_k"]
        if cu.dim() != 1 or cu.numel() != p.batch + 1:
            raise InvalidProblem(f"{'cu_seqlens_' + name[1]} has shape {tuple(cu.shape)}; expected [{p.batch + 1}]")
        rows, longest = (p.packed_q, p.seqlen_q) if name == "sq" else (p.packed_k, p.seqlen_k)
        return guard_offsets(cu.to(device=like.device), rows, longest)

    def varlen(p, t, like, k=True):
        """(layout, group-mode keywords, device flag of bad run-time offsets or None): device
        cu_seqlens and the problem's maxima, no host sync."""
        if not p.is_group:
            return p.layout, {}, None
        cu_q, bad = offsets(p, t, "sq", like)
        kw = dict(cu_seqlens_q=cu_q, max_seqlen_q=p.seqlen_q, _trusted_varlen=True)
        if k:
            cu_k, bad_k = offsets(p, t, "sk", like)
            bad = bad_k if bad is None else (bad if bad_k is None else bad | bad_k)
            kw.update(cu_seqlens_k=cu_k, max_seqlen_k=p.seqlen_k, **lens(p, like))
        return "thd", kw, bad

    def dot_do_o(p, t):
        x = cast(p, t, ("o", "do"))
        layout, kw, bad = varlen(p, t, x["o"], k=False)
        d = ops_bwd.bwd_dot_do_o(x["o"], x["do"], layout=layout, **kw, _via=via)
        ops._poison(bad, d)
        return {"d": d}

    dq_choice = parse_dq(alg.dq) if fam == "bwd_dq_dk_dv" else None
    if dq_choice is not None and dq_choice[0] == "triton" and alg.dchunk:   # the key's chunk runs in both passes
        dq_choice = ("triton", dq_choice[1].with_(DCHUNK=alg.dchunk))
    kv_choice = (("gluon", (alg.block_m, alg.num_stages, alg.variant.endswith("_pers")))
                 if alg.variant in GLUON_BWD_VARIANTS else ("triton", cfg))

    def dq_dk_dv(p, t):
        x = cast(p, t, ("q", "k", "v", "do"))
        layout, kw, bad = varlen(p, t, x["q"])
        res = ops_bwd.bwd_dq_dk_dv(x["q"], x["k"], x["v"], x["do"], t["lse"], t["d"],
                               scale=p.softmax_scale, softcap=p.logits_soft_cap, layout=layout,
                               choice=(kv_choice, dq_choice), return_dbias=p.dbias,
                               **_mask(p), **kw, **_features(p, t, tdt), _via=via)
        dq, dqa, dk, dv = res[:4]
        ops._poison(bad, dq, dqa, dk, dv, *res[4:5])
        out = {"dq": dq, "dk": dk, "dv": dv} if dq is not None else {"dq_acc": dqa, "dk": dk, "dv": dv}
        if p.dbias:
            out["dbias"] = res[4]
        return out

    def convert_dq(p, t):
        if t.get("dq_acc") is None:   # deterministic mode wrote dq in stage 2
            return {}
        q = cast(p, t, ("q",))["q"]
        layout, kw, bad = varlen(p, t, q, k=False)
        dq = ops_bwd.bwd_convert_dq(t["dq_acc"], ops._last_contig(q), layout=layout, **kw, _via=via)
        ops._poison(bad, dq)
        return {"dq": dq}

    def appendkv(p, t):
        """Writes knew/vnew into t['k_cache'] / t['v_cache'] IN PLACE (when they already have the
        kernel's dtype; else into converted copies) and returns the caches under the same names."""
        x = cast(p, t, ("q", "knew", "vnew", "k_cache", "v_cache"))
        rope = {}
        if p.rope != "none":
            need = _longest_before_append(p, t) + max(p.seqlen_knew, p.seqlen_q)
            if t["rotary_cos"].shape[0] < need:   # the kernel does not bound-check table rows
                raise InvalidProblem(f"rotary tables have {t['rotary_cos'].shape[0]} positions; need at least {need}")
            rope = dict(rotary_cos=t["rotary_cos"], rotary_sin=t["rotary_sin"], rope=p.rope,
                        rotary_dim=p.rotary_dim)
        bt = t["block_table"] if p.paged_kv else None
        lens = t["seqlens_k"] if p.runtime_seqlens_k else dev_int32(p, "lens", p.seqlens_k, x["q"])
        q_rot, kc, vc = ops_dec.appendkv_launch(x["q"], x["knew"], x["vnew"], x["k_cache"], x["v_cache"], lens,
                                            block_table=bt, layout=p.layout, block_m=alg.block_m, **rope,
                                            _via=via)
        return {"q_rot": q_rot, "k_cache": kc, "v_cache": vc}

    def prefill(p, t):
        x = cast(p, t, ("q", "k_cache", "v_cache"))
        q = x["q"]
        if p.kv_lookup == "sglang":
            tables = dict(kv_indptr=t["kv_indptr"], kv_page_indices=t["kv_page_indices"])
        else:
            tables = dict(block_table=t["block_table"])
        if p.runtime_seqlens_k:   # read on the device; seqlen_k is their bound
            lens, longest = t["seqlens_k"], p.seqlen_k
        else:
            lens, longest = dev_int32(p, "lens", p.seqlens_k, q), max(p.seqlens_k)
        cu_q, bad = offsets(p, t, "sq", q)
        o, lse = ops_dec.batch_prefill_launch(q, x["k_cache"], x["v_cache"], lens,
                                   cu_seqlens_q=cu_q, max_seqlen_q=p.seqlen_q,
                                   max_seqlen_k=longest, kv_layout=p.kv_layout, scale=p.softmax_scale,
                                   softcap=p.logits_soft_cap, return_lse=True, config=cfg, _trusted_varlen=True,
                                   **tables,
                                   **_mask(p), **_features(p, t, tdt), **_sinks(p, t), _via=via)
        ops._poison(bad, o, lse)
        return {"o": o, "lse": lse}

    def warm_fwd(p, t):
        """``f(q, k, v) -> {"o", "lse"}`` repeating :func:`fwd` on tensors like ``t`` without its
        argument processing (the public API's warm-call cache, whose signature pins shapes,
        strides, dtypes, device and 16-byte alignment), or None: the launch, recorded once more
        here (:mod:`.warm`), must read only q, k, v, o, lse and the device error flag."""
        from ck_core.backends import triton_replay

        from . import warm

        if set(t) != {"q", "k", "v"} or p.is_group or p.store_randval or p.dtype == "fp8" \
                or any(t[n].dtype != tdt or not triton_replay.replayable(t[n]) for n in t):
            return None
        with warm.recording() as recs:
            out = fwd(p, dict(t))
        return warm.replayer(t, out, recs)

    table = {"fwd": fwd, "fwd_splitkv": splitkv_main, "fwd_splitkv_combine": combine,
             "fwd_appendkv": appendkv, "batch_prefill": prefill, "fwd_pagedkv": pagedkv,
             "bwd_dot_do_o": dot_do_o, "bwd_dq_dk_dv": dq_dk_dv,
             "bwd_convert_dq": convert_dq}
    run = table[fam]
    check_names = stages.check_tensor_names

    def launch(p, t):
        check_names(p, t)
        return run(p, t)

    if fam == "fwd":
        launch.warm = warm_fwd
    return launch


def _longest_before_append(p, t) -> int:
    """The longest cache length before an append: the problem's, host run-time lengths read here (no
    sync), or for device run-time lengths the bound the capacity sets (seqlen_k >= length + seqlen_knew)."""
    if not p.runtime_seqlens_k:
        return max(p.seqlens_k)
    lens = t["seqlens_k"]
    if lens.device.type == "cpu" and lens.numel():
        return int(lens.max())
    return p.seqlen_k - p.seqlen_knew


_E4M3 = ()


def _as_kernel_dtype(p, name, x, tdt):
    """A tensor in the kernel's dtype ``tdt``.  Another dtype is refused (a float32 q for an fp16
    problem would be rounded silently), except float32 for bf16 / fp8 problems: that is their numpy
    storage, as ck_core's backends hand numpy data over.  Those are converted; fp8 values outside the
    e4m3 range are refused (torch would saturate or NaN them), which reads one flag back from the
    device on this conversion path only (tensors already in fp8 cost nothing)."""
    import torch

    global _E4M3
    if not _E4M3:
        _E4M3 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))
    if x.dtype == tdt:
        return x
    if not isinstance(x, torch.Tensor):
        raise InvalidProblem(f"tensor {name!r} is a {type(x).__module__}.{type(x).__qualname__}; the triton "
                             "backend takes torch tensors (convert it with torch.from_numpy, or "
                             "Dispatcher.backend_spec.to_backend(x))")
    if p.dtype == "fp8" and x.device.type == "cpu" and x.dtype in _E4M3:
        return x   # the interpreter computes either e4m3 flavour (a GPU multiplies its arch's, fp8_format)
    if not (x.dtype == torch.float32 and p.dtype in ("bf16", "fp8")):
        raise InvalidProblem(f"tensor {name!r} has dtype {x.dtype}; the problem's dtype {p.dtype} needs {tdt}"
                             + (" (or float32 holding bf16 / fp8 values)" if p.dtype in ("bf16", "fp8") else "")
                             + ": convert it, or build the problem with the tensor's dtype")
    if p.dtype == "fp8":
        fmax = float(torch.finfo(tdt).max)
        if bool((x.abs() > fmax).any()):
            raise InvalidProblem(f"tensor {name!r} holds values outside the {tdt} range +-{fmax:g}; quantise "
                                 "(scale into range and pass the factor as scale_q/k/v) before the fp8 forward")
    return x.to(tdt)


# -- ahead-of-time compilation --------------------------------------------------------------

_AOT_FAMILY = {"fwd_pagedkv": "fwd_pagedkv", "fwd_splitkv": "fwd_splitkv", "bwd_dq_dk_dv": "bwd_dq_dk_dv"}


@functools.lru_cache(maxsize=None)
def _source_hash(gluon: bool = False) -> str:
    """Hash of the kernel sources a key compiles from (Gluon keys: gluon_fwd.py, not kernels.py)."""
    from . import configs, gluon_fwd, kernels

    src = inspect.getsource(gluon_fwd if gluon else kernels) + inspect.getsource(configs)
    return hashlib.sha256(src.encode()).hexdigest()


@attrs.frozen
class TritonFmhaRendered:
    family: str
    dtype: str
    config: dict
    source_hash: str
    options: dict
    #: the key's launches on a representative problem (:func:`jit_calls`), which ``ck build``
    #: compiles into the entries the launcher loads; None where the launcher does not load them
    jit_calls: Optional[object] = None

    def compile(self, target, extra_options=None):
        from .aot import aot_compile

        return aot_compile(self.family, self.dtype, self.config, target)


#: the representative batch-mode problem of fwd and the backward: sizes that are multiples of
#: every tile and of 16, MHA: sizes are run-time integers (kernels.py), so any batch, head count,
#: GQA group and length of the key's alignment class loads what this problem built
_JIT_BATCH, _JIT_HEADS, _JIT_SEQ = 2, 16, 512
#: the backward's ragged representative is _JIT_SEQ - _JIT_RAGGED long (no tile divides it); the
#: bottom-right causal one has as many queries over _JIT_SEQ + _JIT_CROSS keys
_JIT_RAGGED, _JIT_CROSS = 7, 128
#: the decode-step representative of the split-KV / paged / append-KV families: Llama-style GQA
#: (32 query heads over 8 key heads), one query row, a 4096-key cache, vLLM's 16-token pages;
#: batch_prefill: two sequences of 512 queries over the same pages
_DEC_BATCH, _DEC_HQ, _DEC_HK, _DEC_SK, _DEC_PAGE, _PREFILL_SQ = 2, 32, 8, 4096, 16, 512
#: the split counts a combine key is built for (the key has none; the count is the problem's): one
#: per BLOCK_S (max(2, the next power of two)), the only constexpr the count sets (NUM_SPLITS is a
#: run-time integer)
_COMBINE_SPLITS = (2, 3, 5, 9, 17, 33, 65)


def _representatives(key, batch: Optional[int] = None):
    """``[(problem, tensors)]`` that :func:`jit_calls` runs the launcher on, those the key supports
    (``tensors()``: meta tensors, nothing runs, laid out as the public entry points hand them over).
    ``batch``: another batch size, the same specialisation (tests: a problem other than the built one)."""
    return [(p, t) for p, t in _candidates(key, batch) if supports(key, p) is None]


def _candidates(key, batch):
    import torch

    from ...problem import FmhaProblem

    s, fam = key.signature, key.signature.family
    tdt = _torch_dtype(s.dtype, key.arch)
    f32, i32 = torch.float32, torch.int32

    def meta(*shape, dt=tdt):
        return torch.empty(shape, dtype=dt, device="meta")

    dims = dict(hdim_q=s.hdim_q, hdim_v=s.hdim_v, dtype=s.dtype)
    causal_br = dict(mask="bottom_right", window_left=-1, window_right=0)   # decode's causal mask
    if fam in ("fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"):
        b, h, n = batch or _JIT_BATCH, _JIT_HEADS, _JIT_SEQ
        hk = h // key.algorithm.gsplit if key.algorithm.gsplit else h   # a group split needs a GQA group that size

        def v_fwd(n):   # fp8 on an arch that reads V key-contiguous: as ops.v_key_major lays it out
            if s.dtype == "fp8" and fp8_v_trans(_arch_spec(key.arch)):
                return meta(b, h, s.hdim_v, n).transpose(2, 3)
            return meta(b, h, n, s.hdim_v)

        tensors = {"fwd": lambda n, nk: dict(q=meta(b, h, n, s.hdim_q), k=meta(b, h, nk, s.hdim_q), v=v_fwd(nk)),
                   "bwd_dot_do_o": lambda n, nk: dict(o=meta(b, h, n, s.hdim_v), do=meta(b, h, n, s.hdim_v)),
                   "bwd_dq_dk_dv": lambda n, nk: dict(q=meta(b, h, n, s.hdim_q), k=meta(b, hk, nk, s.hdim_q),
                                                      v=meta(b, hk, nk, s.hdim_v), do=meta(b, h, n, s.hdim_v),
                                                      lse=meta(b, h, n, dt=f32), d=meta(b, h, n, dt=f32)),
                   "bwd_convert_dq": lambda n, nk: dict(q=meta(b, h, n, s.hdim_q),
                                                        dq_acc=meta(b, h, n, s.hdim_q, dt=f32))}[fam]
        masks = ("none",) if fam in ("bwd_dot_do_o", "bwd_convert_dq") else ("none", "top_left")   # no mask there
        # sizes are run-time values (kernels.py: what the kernels specialise on); the backward's one
        # size-derived constexpr is whether both lengths are whole tiles (launch._even): a ragged
        # length too, so every problem of the key's alignment class loads a built kernel
        lens = (n, n - _JIT_RAGGED) if fam == "bwd_dq_dk_dv" else (n,)
        out = [(FmhaProblem(family=fam, batch=b, nhead_q=h, nhead_k=hk, seqlen_q=ln, seqlen_k=ln, mask=m,
                            lse=fam == "fwd", **dims), functools.partial(tensors, ln, ln)) for ln in lens for m in masks]
        # a causal mask aligned bottom-right (FlashAttention's causal: BOTTOM_RIGHT), over more keys than
        # queries (ragged); the backward also square with whole tiles (its EVEN class)
        brs = {"fwd": ((n - _JIT_RAGGED, n + _JIT_CROSS),),
               "bwd_dq_dk_dv": ((n - _JIT_RAGGED, n + _JIT_CROSS), (n, n))}.get(fam, ())
        for sq, sk in brs:
            out.append((FmhaProblem(family=fam, batch=b, nhead_q=h, nhead_k=hk, seqlen_q=sq, seqlen_k=sk,
                                    mask="bottom_right", lse=fam == "fwd", **dims), functools.partial(tensors, sq, sk)))
        return out
    b, hq, hk, sk, ps = batch or _DEC_BATCH, _DEC_HQ, _DEC_HK, _DEC_SK, _DEC_PAGE
    dec = dict(batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=1, seqlen_k=sk, **dims)
    pages = b * (sk // ps)

    def paged_kv(d):   # paged_decode's bhsd view of [pages, P, Hk, D] pools
        return meta(pages, ps, hk, d).transpose(1, 2)

    table = lambda: meta(b, sk // ps, dt=i32)   # noqa: E731
    if fam in ("fwd_splitkv", "fwd_pagedkv"):
        n = key.algorithm.splits or 1
        q = lambda: meta(b, hq, 1, s.hdim_q)   # noqa: E731
        kw = dict(dec, family=fam, num_splits=n, lse=True)
        paged = FmhaProblem(**kw, runtime_seqlens_k=True, paged_kv=True, page_size=ps, **causal_br)
        out = [(paged, lambda: dict(q=q(), k_cache=paged_kv(s.hdim_q), v_cache=paged_kv(s.hdim_v),
                                    block_table=table(), seqlens_k=meta(b, dt=i32)))]
        if fam == "fwd_splitkv":   # splitkv_decode: contiguous caches, with and without run-time lengths
            kv = lambda: dict(q=q(), k=meta(b, hk, sk, s.hdim_q), v=meta(b, hk, sk, s.hdim_v))   # noqa: E731
            out = [(FmhaProblem(**kw), kv),
                   (FmhaProblem(**kw, runtime_seqlens_k=True, **causal_br), lambda: dict(kv(), seqlens_k=meta(b, dt=i32)))
                   ] + out
        return out
    if fam == "fwd_splitkv_combine":
        p = FmhaProblem(family=fam, lse=True, **dec)
        return [(attrs.evolve(p, num_splits=n),
                 functools.partial(lambda n: dict(q=meta(b, hq, 1, s.hdim_q), o_acc=meta(b, hq, 1, n, s.hdim_v, dt=f32),
                                                  lse_acc=meta(b, hq, 1, n, dt=f32)), n))
                for n in _COMBINE_SPLITS]
    if fam == "fwd_appendkv":   # one new token per step, into contiguous and paged caches
        new = lambda: dict(q=meta(b, hq, 1, s.hdim_q), knew=meta(b, hk, 1, s.hdim_q),   # noqa: E731
                           vnew=meta(b, hk, 1, s.hdim_v), seqlens_k=meta(b, dt=i32))
        kw = dict(dec, family=fam, seqlen_knew=1, runtime_seqlens_k=True)
        return [(FmhaProblem(**kw),
                 lambda: dict(new(), k_cache=meta(b, hk, sk, s.hdim_q), v_cache=meta(b, hk, sk, s.hdim_v))),
                (FmhaProblem(**kw, paged_kv=True, page_size=ps),
                 lambda: dict(new(), k_cache=paged_kv(s.hdim_q), v_cache=paged_kv(s.hdim_v), block_table=table()))]
    if fam == "batch_prefill":   # vLLM block tables over linear pages, causal and not
        sq = _PREFILL_SQ
        kw = dict(dec, family=fam, mode="group", seqstart_q=tuple(range(0, (b + 1) * sq, sq)), seqlen_q=sq,
                  runtime_seqlens_k=True, paged_kv=True, page_size=ps, kv_layout="linear", kv_lookup="vllm", lse=True)
        t = lambda: dict(q=meta(b * sq, hq, s.hdim_q), k_cache=meta(pages, ps, hk, s.hdim_q),   # noqa: E731
                         v_cache=meta(pages, ps, hk, s.hdim_v), block_table=table(), seqlens_k=meta(b, dt=i32))
        return [(FmhaProblem(**kw), t), (FmhaProblem(**kw, **causal_br), t)]
    return []


def jit_calls(key) -> list:
    """The launches of ``key``'s launcher (:func:`make_launcher`) on its representative problems
    (:func:`_representatives`), ``[(suffix, fn, args, kwargs)]``: what ``ck build`` compiles.
    A representative the key cannot run (:func:`supports`) is skipped."""
    calls: list = []
    launch = make_launcher(key, capture=calls)
    for p, tensors in _representatives(key):
        launch(p, tensors())
    return calls


def render(key, backend: str):
    if backend != "triton" or not isinstance(key.signature, TritonFmhaSig):
        raise InvalidProblem(f"{key.name}: only Triton FMHA keys render (CK-rule keys are CK Tile instances)")
    s, a = key.signature, key.algorithm
    cfg = dict(a.config().as_dict(), hdim_q=s.hdim_q, hdim_v=s.hdim_v)
    dtype = s.dtype
    if dtype == "fp8":   # the arch's e4m3 flavour as a Triton type; o in bf16
        from .aot import FP8_TRITON

        spec = _arch_spec(key.arch)
        dtype = FP8_TRITON[fp8_format(spec)]
        cfg["out_dtype"] = "bf16"
        if fp8_v_trans(spec):   # the kernel the launcher runs: key-contiguous V
            cfg["v_trans"] = True
    src = _source_hash(a.variant in GLUON_VARIANTS)   # (a Gluon key builds its bhsd, non-causal, LSE instance)
    h = hashlib.sha256((src + repr(sorted(cfg.items())) + s.family + dtype).encode()).hexdigest()
    return TritonFmhaRendered(s.family, dtype, cfg, h, {"num_warps": a.num_warps, "num_stages": a.num_stages},
                              functools.partial(jit_calls, key) if _representatives(key) else None)
