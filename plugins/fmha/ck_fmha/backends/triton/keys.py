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
import re
from typing import Optional

import attrs

from ck_core.errors import ConfigError, MissingKernel
from ck_core.key import KernelKey, RecordSchema

from . import smem

from ...heuristics import (DQ_ATOMIC, dq_gluon, dq_triton, gluon_bwd_reason, gluon_dkdv_reason,  # noqa: F401
                          interpreting, parse_dq)
from .configs import (GLUON_BWD_BLOCK_N, GLUON_BWD_VARIANTS, GLUON_BWD_WARPS, GSPLITS, KVSPLIT,  # noqa: F401
                      fp8_format, fp8_v_trans, hdim_class, hopper as _hopper)

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


def artifact_name(key) -> str:
    """The kernel-cache name of ``key``'s compiled Triton kernels (entries ``<artifact name>/<kernel>``,
    what its launcher loads and ``ck build`` writes): its name with each head dim replaced by the head
    dim its kernels are compiled for (``configs.hdim_class``: the padded blocks; the exact head dim is a
    run-time argument with an alignment class, kernels.py) and without the split count (a run-time
    argument too).  Keys that differ only there share their compiled kernels: d40 and d56 load the
    entries of d64's key with the same tile where the kernels' specialisation (the cache entry's
    material: constexprs, alignment classes) is the same."""
    s, a = key.signature, key.algorithm
    if not isinstance(s, TritonFmhaSig):
        return key.name
    body = format_name(attrs.evolve(s, hdim_q=hdim_class(s.hdim_q, a.dchunk), hdim_v=hdim_class(s.hdim_v, a.dchunk)),
                       attrs.evolve(a, splits=0))
    return f"{body}.{key.arch}.{key.backend}"


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
