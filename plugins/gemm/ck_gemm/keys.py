"""GEMM kernel keys: signature, algorithm, CK-style names, the rules that make a key legal.

Name grammar (tokens joined by ``_``)::

    gemm_<dtype>_<layout>_<pipeline>_<epilogue>_<scheduler>_<pad>_
         <TMxTNxTK>_<WMxWNxWK>_<WTMxWTNxWTK>[_c<dtype_c>][_d<n><op>][_<act>]
         [_sk<split_k>][_s<stages>][_v<variant>][_g<group_m>][_preshuffle]

``pad`` is ``npad`` or ``p`` followed by the padded dims (``pmnk``, ``pk``...).
``preshuffle``: B is read pre-shuffled in the key's N x K tile order (CK's preshuffle GEMM).
"""
from __future__ import annotations

import functools

import attrs
import numpy as np

from ck_core.dtypes import ELEMENT_BYTES
from ck_core.errors import ConfigError, MissingKernel
from ck_core.key import KernelKey, RecordSchema

from . import ck_rules
from .problem import ACTIVATIONS, D_OPS, DEFAULT_C, DTYPES, LAYOUTS


AMD_PIPELINES = ("mem", "compv3", "compv4")
#: LDS buffers a pipeline keeps per stage (CK: compv4 double-buffers LDS)
LDS_BUFFERS = {"mem": 1, "compv3": 1, "compv4": 2}
SCHEDULERS = ("intrawave", "interwave")
EPILOGUES = ("cshuffle", "default")
VARIANTS = ("tile", "persistent", "tma", "tma_ws", "tma_persistent", "tma_persistent_ws", "tma_cs",
            "tma_persistent_cs", "streamk", "tma_streamk")
#: name tokens of the variants (no underscores, so names split cleanly on "_")
VARIANT_TOKEN = {"persistent": "vpers", "tma": "vtma", "tma_ws": "vtmaws",
                 "tma_persistent": "vtmapers", "tma_persistent_ws": "vtmapersws",
                 "tma_cs": "vtmacs", "tma_persistent_cs": "vtmaperscs", "streamk": "vstk",
                 "tma_streamk": "vtmastk"}
_TOKEN_VARIANT = {t: v for v, t in VARIANT_TOKEN.items()}
C_DTYPES = ("fp16", "bf16", "fp32", "int32")

#: the vocabulary of imported keys (``pipeline`` is an arch fact: any token here,
#: the arch's rules decide); sizes are at least 1 (they divide)
SIG_CHOICES = {"dtype": DTYPES, "layout": LAYOUTS, "dtype_c": ("",) + C_DTYPES, "d_op": D_OPS,
               "activation": ACTIVATIONS}
SIG_BOUNDS = {"num_d": (0, 4)}
ALG_CHOICES = {"scheduler": SCHEDULERS, "epilogue": EPILOGUES, "variant": VARIANTS}
_SIZE = (1, 1 << 16)
ALG_BOUNDS = {**{f: _SIZE for f in ("tile_m", "tile_n", "tile_k", "warp_m", "warp_n", "warp_k",
                                     "warp_tile_m", "warp_tile_n", "warp_tile_k", "split_k",
                                     "group_m", "epi_subtile")},
              "stages": (0, 64)}
#: variants that read A and B through tensor descriptors (TMA)
DESCRIPTOR_VARIANTS = tuple(v for v in VARIANTS if v.startswith("tma"))
#: variants that also store C through a descriptor
C_DESCRIPTOR_VARIANTS = ("tma_cs", "tma_persistent_cs")
#: variants that may split K (a persistent loop owns whole tiles; split-K partials go through pointers)
SPLITK_VARIANTS = ("tile", "tma", "tma_ws")
#: stream-K variants: a grid of the arch's SMs splits the K steps of the last waves' tiles evenly
#: per problem (so their keys keep split_k 1) and sums partial tiles in the same launch
STREAMK_VARIANTS = ("streamk", "tma_streamk")
#: variants whose Triton templates read a pre-shuffled B (one contiguous tile a K step; pointer
#: loads: the packed tiles need no descriptor), and the name token of a pre-shuffled signature
PRESHUFFLE_VARIANTS = ("tile", "persistent", "tma", "tma_persistent", "tma_cs", "tma_persistent_cs")
PRESHUFFLE_TOKEN = "preshuffle"
#: backends that run pre-shuffled-B keys (the CK C++ templates here render the standard pipeline only)
PRESHUFFLE_BACKENDS = ("numpy", "triton")


@attrs.frozen(cache_hash=True)
class GemmSignature:
    dtype: str
    layout: str
    dtype_c: str = ""
    num_d: int = 0
    d_op: str = "add"
    activation: str = "none"
    preshuffle: bool = False   # B pre-shuffled in the kernel's tile order (CK's preshuffle GEMM)

    def __attrs_post_init__(self):
        if not self.dtype_c:
            object.__setattr__(self, "dtype_c", DEFAULT_C[self.dtype])

    def name_body(self, alg: "GemmAlgorithm") -> str:
        return format_name(self, alg)


@attrs.frozen(cache_hash=True)
class GemmAlgorithm:
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
    epilogue: str = "cshuffle"
    pad_m: bool = False
    pad_n: bool = False
    pad_k: bool = False
    split_k: int = 1
    stages: int = 0          # 0: the pipeline's default
    variant: str = "tile"    # Triton realisation (tile loop, TMA, persistent, warp-specialised)
    group_m: int = 8         # Triton's grouped tile order (L2 reuse)
    epi_subtile: int = 1     # C stored in this many N-slices (TMA-store ``_cs`` variants)

    @property
    def num_warps(self) -> int:
        return self.warp_m * self.warp_n * self.warp_k


def _pad_token(a: GemmAlgorithm) -> str:
    dims = "".join(d for d, on in (("m", a.pad_m), ("n", a.pad_n), ("k", a.pad_k)) if on)
    return "p" + dims if dims else "npad"


def format_name(sig: GemmSignature, a: GemmAlgorithm) -> str:
    parts = ["gemm", sig.dtype, sig.layout, a.pipeline, a.epilogue, a.scheduler, _pad_token(a),
             f"{a.tile_m}x{a.tile_n}x{a.tile_k}", f"{a.warp_m}x{a.warp_n}x{a.warp_k}",
             f"{a.warp_tile_m}x{a.warp_tile_n}x{a.warp_tile_k}"]
    if sig.dtype_c != DEFAULT_C[sig.dtype]:
        parts.append("c" + sig.dtype_c)
    if sig.num_d:
        parts.append(f"d{sig.num_d}{sig.d_op}")
    if sig.activation != "none":
        parts.append(sig.activation)
    if a.split_k != 1:
        parts.append(f"sk{a.split_k}")
    if a.stages:
        parts.append(f"s{a.stages}")
    if a.variant != "tile":
        parts.append(VARIANT_TOKEN[a.variant])
    if a.group_m != 8:
        parts.append(f"g{a.group_m}")
    if a.epi_subtile != 1:
        parts.append(f"e{a.epi_subtile}")
    if sig.preshuffle:
        parts.append(PRESHUFFLE_TOKEN)
    return "_".join(parts)


def _triple(tok: str, what: str, name: str) -> tuple:
    try:
        a, b, c = (int(x) for x in tok.split("x"))
    except ValueError:
        raise MissingKernel(f"GEMM kernel name {name!r}: {what} {tok!r} is not AxBxC") from None
    return a, b, c


def parse_name(body: str):
    toks = body.split("_")
    if len(toks) < 10 or toks[0] != "gemm":
        raise MissingKernel(f"{body!r} is not a GEMM kernel name (gemm_<dtype>_<layout>_...)")
    _, dtype, layout, pipeline, epilogue, scheduler, pad = toks[:7]
    if dtype not in DTYPES or layout not in LAYOUTS:
        raise MissingKernel(f"GEMM kernel name {body!r}: unknown dtype {dtype!r} or layout {layout!r}")
    if pad != "npad" and not (pad.startswith("p") and set(pad[1:]) <= set("mnk")):
        raise MissingKernel(f"GEMM kernel name {body!r}: bad padding token {pad!r}")
    tile = _triple(toks[7], "tile", body)
    wave = _triple(toks[8], "wave layout", body)
    wt = _triple(toks[9], "warp tile", body)
    sig = dict(dtype=dtype, layout=layout)
    alg = dict(tile_m=tile[0], tile_n=tile[1], tile_k=tile[2], warp_m=wave[0], warp_n=wave[1],
               warp_k=wave[2], warp_tile_m=wt[0], warp_tile_n=wt[1], warp_tile_k=wt[2], pipeline=pipeline, epilogue=epilogue, scheduler=scheduler,
               pad_m="m" in pad[1:] if pad != "npad" else False,
               pad_n="n" in pad[1:] if pad != "npad" else False,
               pad_k="k" in pad[1:] if pad != "npad" else False)
    for tok in toks[10:]:
        if tok in ACTIVATIONS:
            sig["activation"] = tok
        elif tok.startswith("sk") and tok[2:].isdigit():
            alg["split_k"] = int(tok[2:])
        elif tok.startswith("s") and tok[1:].isdigit():
            alg["stages"] = int(tok[1:])
        elif tok.startswith("g") and tok[1:].isdigit():
            alg["group_m"] = int(tok[1:])
        elif tok.startswith("e") and tok[1:].isdigit():
            alg["epi_subtile"] = int(tok[1:])
        elif tok in _TOKEN_VARIANT:
            alg["variant"] = _TOKEN_VARIANT[tok]
        elif tok == PRESHUFFLE_TOKEN:
            sig["preshuffle"] = True
        elif tok.startswith("d") and tok[1:2].isdigit() and tok[2:] in D_OPS:
            sig["num_d"], sig["d_op"] = int(tok[1]), tok[2:]
        elif tok.startswith("c") and tok[1:] in C_DTYPES:
            sig["dtype_c"] = tok[1:]
        else:
            raise MissingKernel(f"GEMM kernel name {body!r}: unknown token {tok!r}")
    try:
        return from_fields(sig, alg)
    except ConfigError as exc:
        raise MissingKernel(f"GEMM kernel name {body!r}: {exc}") from None


_SIG = RecordSchema(GemmSignature, what="GEMM signature", choices=SIG_CHOICES, bounds=SIG_BOUNDS)
_ALG = RecordSchema(GemmAlgorithm, what="GEMM algorithm", choices=ALG_CHOICES, bounds=ALG_BOUNDS)


def from_fields(sig: dict, alg: dict):
    """Signature and algorithm of untrusted field dicts (JSON, parsed names), every field checked."""
    return _SIG(sig), _ALG(alg)


def legal(key: KernelKey, arch, tuned=None) -> str | None:
    """Why the enumeration rules would not produce ``key`` on ``arch`` (or None).

    ``tuned(arch, backend, dtypes, layouts)`` lists the arch's measured winners, which join the
    space whatever the shared-memory model says (``ck_gemm.heuristics.legal`` passes its reader)."""
    sig = key.signature
    why = rules_violation(sig, key.algorithm, arch) or preshuffle_violation(sig, key.algorithm)
    if why is None and sig.preshuffle and key.backend not in PRESHUFFLE_BACKENDS:
        why = f"the {key.backend} backend has no pre-shuffled-B template (backends {PRESHUFFLE_BACKENDS})"
    if why is None and key.backend == "triton":
        why = triton_smem_violation(sig.dtype, key.algorithm, arch, sig)
        # a winner's key with another epilogue or its pre-shuffled twin (the space adds those) too, where
        # that twin stages nothing more than the winner (a fused D tensor or a wider C does: the sm90
        # 128x256x64 4-stage C-descriptor winner with one D tensor needs 233,504 B of 232,448)
        plain = KernelKey(key.op, GemmSignature(sig.dtype, sig.layout), key.algorithm, key.arch, key.backend)
        if why and tuned is not None and plain in tuned(arch, key.backend, [sig.dtype], [sig.layout]) \
                and twin_fits(sig, key.algorithm, arch):
            why = None
    return why


# -- the rules of the kernel space (enumerated in ck_gemm.space) ------------------------------

def lds_bytes(sig: GemmSignature, a: GemmAlgorithm, nvidia: bool = False) -> int:
    """Shared memory the A and B tiles take (what the arch's LDS limit prunes)."""
    eb = ELEMENT_BYTES[sig.dtype]
    per_stage = (a.tile_m + a.tile_n) * a.tile_k * eb
    if nvidia or a.stages:
        return per_stage * max(a.stages, 1)
    return per_stage * LDS_BUFFERS.get(a.pipeline, 1)


def warp_tiles_for(arch, dtype):
    return tuple(tuple(t) for t in arch.warp_tiles.get(dtype, ()))


def rules_violation(sig: GemmSignature, a: GemmAlgorithm, arch) -> str | None:
    """Why GEMM ``(sig, a)`` is illegal on ``arch``, or None.

    The tile rules from the arch's facts (:func:`_tile_violation`), then, on AMD
    archs, CK Tile's warp-size rules (:func:`ck_rules.violation`).  Arch
    plugins may add their own on top (``ArchSpec.rules``).
    """
    why = _tile_violation(sig, a, arch)
    if why is None and arch.vendor == "amd":
        why = ck_rules.violation(sig, a, arch.name, arch.warp_size)
    return why


def _tile_violation(sig: GemmSignature, a: GemmAlgorithm, arch) -> str | None:
    """The rules that follow from the arch's facts alone (the same for every layout)."""
    if sig.dtype not in arch.dtypes:
        return f"{arch.name} has no {sig.dtype} matrix instructions"
    wt = (a.warp_tile_m, a.warp_tile_n, a.warp_tile_k)
    legal = warp_tiles_for(arch, sig.dtype)
    if legal and wt not in legal:
        return f"warp tile {wt} is not a {sig.dtype} instruction tile of {arch.name}"
    if arch.wave_layouts and (a.warp_m, a.warp_n, a.warp_k) not in tuple(map(tuple, arch.wave_layouts)):
        return f"wave layout {a.warp_m}x{a.warp_n}x{a.warp_k} is not legal on {arch.name}"
    if a.tile_m % (a.warp_m * a.warp_tile_m) or a.tile_n % (a.warp_n * a.warp_tile_n):
        return "tile M/N must be multiples of wave layout x warp tile"
    if a.tile_k % (a.warp_k * a.warp_tile_k):
        return "tile K must be a multiple of warp_k x warp tile K"
    if a.pipeline not in arch.pipelines:
        return f"pipeline {a.pipeline} does not exist on {arch.name}"
    if a.scheduler == "interwave" and a.pipeline != "mem":
        return "the interwave scheduler exists only for the mem pipeline"
    limit = arch.pipeline_lds_limit.get(a.pipeline, arch.lds_bytes)
    need = lds_bytes(sig, a, arch.vendor == "nvidia")
    if need > limit:
        return f"needs {need} B of LDS/shared memory, {arch.name} allows {limit} B for {a.pipeline}"
    return None


def preshuffle_violation(sig: GemmSignature, a: GemmAlgorithm) -> str | None:
    """Why a pre-shuffled-B key ``(sig, a)`` cannot exist (None: it can, or B is not pre-shuffled).

    B is packed for the key's N x K tile and zero-padded, so the key pads every dimension (A's
    rows and K tail, C's edges stay masked) and reads whole tiles (variants
    :data:`PRESHUFFLE_VARIANTS`: through pointers, or one descriptor over the packed tile rows);
    the one-tile-a-program variants (``tile``, ``tma``) may split K as the plain keys do (the
    split-K choices the arch enumerates for skinny M), a persistent loop owns whole tiles."""
    if not sig.preshuffle:
        return None
    if sig.layout != "rcr":
        return f"a pre-shuffled B is a linear weight: layout rcr only, not {sig.layout}"
    if a.variant not in PRESHUFFLE_VARIANTS:
        return f"pre-shuffled B is read by variants {PRESHUFFLE_VARIANTS}, not {a.variant}"
    if a.split_k != 1 and a.variant not in ("tile", "tma"):
        return f"a pre-shuffled-B key splits K on variants tile and tma only, not {a.variant}"
    if not (a.pad_m and a.pad_n and a.pad_k):
        return "a pre-shuffled-B key pads M, N and K (B is zero-padded to whole tiles)"
    return None


def variant_violation(a: GemmAlgorithm) -> str | None:
    """Variant combinations no Triton template implements (culled from the enumeration)."""
    if a.split_k > 1 and a.variant not in SPLITK_VARIANTS:
        return f"split-K needs a variant in {SPLITK_VARIANTS}, not {a.variant}"
    if a.epi_subtile > 1 and a.variant not in C_DESCRIPTOR_VARIANTS:
        return f"a subtiled epilogue needs a C-descriptor variant, not {a.variant}"
    return None


def split_violation(a: GemmAlgorithm, facts: dict) -> str | None:
    """Split-K keys outside the arch's ``split_k`` facts (variants, most C tile elements)."""
    if a.split_k == 1:
        return None
    if a.variant not in facts.get("variants", SPLITK_VARIANTS):
        return f"the arch splits K only on variants {facts.get('variants')}"
    if a.tile_m * a.tile_n > facts.get("max_tile_mn", a.tile_m * a.tile_n):
        return f"the arch splits K only on C tiles of at most {facts['max_tile_mn']} elements"
    return None


def streamk_violation(a: GemmAlgorithm, facts: dict) -> str | None:
    """Stream-K keys outside the arch's ``streamk`` facts (the C tiles it enumerates them on)."""
    if a.variant not in STREAMK_VARIANTS or not facts:
        return None
    tiles = facts.get("tiles_mn")
    if tiles and (a.tile_m, a.tile_n) not in tuple(map(tuple, tiles)):
        return f"the arch enumerates stream-K keys only on C tiles {tiles}"
    if a.num_warps not in facts.get("warps", (a.num_warps,)):
        return f"the arch enumerates stream-K keys only with {facts['warps']} warps"
    return None


def descriptor_violation(a: GemmAlgorithm, problem) -> str | None:
    """Why the tensor descriptors of a TMA variant cannot describe ``problem``'s operands.

    A descriptor needs every stride but the last to be a multiple of 16 bytes.
    Operands are assumed stored contiguously with 16-byte aligned bases (as the
    public API passes them); the launcher checks the actual tensors and raises.
    """
    if a.variant not in DESCRIPTOR_VARIANTS:
        return None
    eb = ELEMENT_BYTES[problem.dtype]
    rows = {"A": problem.k if problem.layout[0] == "r" else problem.m,
            "B": problem.n if problem.layout[1] == "r" else problem.k}
    for name, n in rows.items():
        if n * eb % 16:
            return (f"{name}'s stored rows are {n} x {eb} B, not a multiple of 16 B: the TMA variant "
                    f"{a.variant} needs 16-byte aligned strides (a pointer variant runs it)")
    if a.variant in C_DESCRIPTOR_VARIANTS:
        if problem.layout[2] != "r":
            return f"variant {a.variant} stores C through a descriptor: C must be row-major"
        if problem.n * ELEMENT_BYTES[problem.dtype_c] % 16:
            return (f"C's rows are {problem.n} x {ELEMENT_BYTES[problem.dtype_c]} B, not a multiple of 16 B: "
                    f"variant {a.variant} stores C through a descriptor")
    return None


def triton_smem_violation(dtype: str, alg: GemmAlgorithm, arch, sig: GemmSignature | None = None) -> str | None:
    """On the triton backend the Triton template's own shared-memory model decides.

    Triton allocates ``num_stages`` buffers (plus epilogue scratch), not CK's
    LDS buffers, so the CK estimate would let kernels through that do not fit.
    ``sig``: the key's signature, whose output dtype and D tensors the epilogue stages
    (without it: the default output and D tensors counted, as the space enumerates).
    """
    model = _triton_smem_model()
    if model is None:  # triton missing: nothing to compile, nothing to prune
        return None
    smem_bytes, config_of_algorithm = model
    if sig is None:
        need = smem_bytes(config_of_algorithm(alg), dtype)
    else:
        need = smem_bytes(config_of_algorithm(alg), dtype, out_dtype=sig.dtype_c, num_d=sig.num_d)
    if need > arch.lds_bytes:
        return f"Triton kernel needs {need} B of shared memory/LDS; {arch.name} has {arch.lds_bytes} B"
    return None


@functools.lru_cache(maxsize=1)
def twin_fits(sig: GemmSignature, alg: GemmAlgorithm, arch) -> bool:
    """Whether a measured winner's ``alg`` with ``sig``'s epilogue (D tensors, C dtype, pre-shuffled B) may
    join the triton space: its estimate fits ``arch``, or it stages nothing more than the plain winner
    (whose measurement says it fits where the estimate, an upper bound, says not)."""
    return triton_smem_violation(sig.dtype, alg, arch, sig) is None \
        or _smem_of(sig, alg) <= _smem_of(GemmSignature(sig.dtype, sig.layout), alg)


def _smem_of(sig: GemmSignature, alg: GemmAlgorithm) -> int:
    """The Triton template's shared-memory estimate of ``alg`` with ``sig``'s epilogue (0 without triton)."""
    model = _triton_smem_model()
    if model is None:
        return 0
    smem_bytes, config_of_algorithm = model
    return smem_bytes(config_of_algorithm(alg), sig.dtype, out_dtype=sig.dtype_c, num_d=sig.num_d)


def _triton_smem_model():
    """Triton's shared-memory model, imported once: a failed import is not cached by Python,
    and retrying it per key made a triton-less enumeration take minutes."""
    try:
        from .backends.triton.configs import config_of_algorithm, smem_bytes
    except ImportError:
        return None
    return smem_bytes, config_of_algorithm


def _signature_why(s, backend: str, problem) -> str | None:
    """The part of :func:`supports` that reads the key's signature and backend only."""
    if s.dtype != problem.dtype or s.dtype_c != problem.dtype_c:
        return f"kernel is {s.dtype}->{s.dtype_c}, problem {problem.dtype}->{problem.dtype_c}"
    if s.layout != problem.layout:
        return f"kernel layout {s.layout}, problem {problem.layout}"
    if (s.num_d, s.activation) != (problem.num_d, problem.activation) or (
            s.num_d and s.d_op != problem.d_op):
        return "epilogue (D tensors / activation) differs"
    if s.preshuffle != problem.preshuffle:
        return ("the problem's B is pre-shuffled; the kernel reads a plain B" if problem.preshuffle
                else "the kernel reads a pre-shuffled B; the problem's is plain")
    if backend == "triton" and s.num_d > 2:
        return "the Triton kernels fuse at most 2 D tensors"
    return None


def supports(key: KernelKey, problem) -> str | None:
    s, a = key.signature, key.algorithm
    why = _signature_why(s, key.backend, problem)
    if why is not None:
        return why
    if problem.preshuffle:
        why = preshuffle_violation(s, a) or _pack_why(a, problem)
        if why is not None:
            return why
    if problem.m % a.tile_m and not a.pad_m:
        return f"M={problem.m} is not a multiple of tile M {a.tile_m} and the kernel does not pad M"
    if problem.n % a.tile_n and not a.pad_n:
        return f"N={problem.n} is not a multiple of tile N {a.tile_n} and the kernel does not pad N"
    if problem.k % (a.tile_k * a.split_k) and not a.pad_k:
        return f"K={problem.k} is not a multiple of tile K x split-K and the kernel does not pad K"
    if key.backend == "triton":
        # a key built by hand or imported (not enumerated) may still pair split-K with a persistent loop
        return variant_violation(a) or descriptor_violation(a, problem)
    return None


def _pack_why(a: GemmAlgorithm, problem) -> str | None:
    if problem.pack_n and (a.tile_n, a.tile_k) != (problem.pack_n, problem.pack_k):
        return (f"B was pre-shuffled for tile N x K {problem.pack_n}x{problem.pack_k}; the kernel's is "
                f"{a.tile_n}x{a.tile_k}")
    return None


class _SupportColumns:
    """What :func:`supports_many` reads of a tuple of keys, gathered once per tuple."""

    def __init__(self, keys: tuple):
        self.keys = keys
        groups: dict = {}
        variants: dict = {}
        for i, k in enumerate(keys):
            groups.setdefault((k.signature, k.backend), []).append(i)
            if k.backend == "triton":
                variants.setdefault(k.algorithm.variant, []).append(i)
        self.groups = [(sig, be, np.array(ix, dtype=np.intp)) for (sig, be), ix in groups.items()]
        # descriptor_violation reads the algorithm's variant only: one representative per variant
        self.variants = [(keys[ix[0]].algorithm, np.array(ix, dtype=np.intp)) for ix in variants.values()]
        algs = [k.algorithm for k in keys]
        self.tile_m = np.array([a.tile_m for a in algs], dtype=np.int64)
        self.tile_n = np.array([a.tile_n for a in algs], dtype=np.int64)
        self.tile_ks = np.array([a.tile_k * a.split_k for a in algs], dtype=np.int64)
        self.tile_k = np.array([a.tile_k for a in algs], dtype=np.int64)
        # keys that read a pre-shuffled B and may (problem-independent rules)
        self.preshuffle_ok = np.array([k.signature.preshuffle and preshuffle_violation(k.signature, k.algorithm)
                                       is None for k in keys])
        self.pad_m = np.array([bool(a.pad_m) for a in algs])
        self.pad_n = np.array([bool(a.pad_n) for a in algs])
        self.pad_k = np.array([bool(a.pad_k) for a in algs])
        # problem-independent: a hand-built triton key pairing variants no template implements
        self.static_ok = np.array([not (k.backend == "triton" and variant_violation(k.algorithm) is not None)
                                   for k in keys])


_COLUMNS: dict = {}


def supports_many(keys: tuple, problem) -> np.ndarray:
    """``supports(key, problem) is None`` for every key of ``keys`` (numpy over the keys' tiles;
    the signature and descriptor checks once per distinct signature / variant)."""
    cols = _COLUMNS.get(id(keys))
    if cols is None or cols.keys is not keys:
        if len(_COLUMNS) >= 256:
            _COLUMNS.clear()
        cols = _COLUMNS[id(keys)] = _SupportColumns(keys)
    m, n, k = problem.m, problem.n, problem.k
    ok = (cols.static_ok & ((m % cols.tile_m == 0) | cols.pad_m) & ((n % cols.tile_n == 0) | cols.pad_n)
          & ((k % cols.tile_ks == 0) | cols.pad_k))
    if problem.preshuffle:
        ok &= cols.preshuffle_ok
        if problem.pack_n:
            ok &= (cols.tile_n == problem.pack_n) & (cols.tile_k == problem.pack_k)
    for sig, backend, ix in cols.groups:
        if _signature_why(sig, backend, problem) is not None:
            ok[ix] = False
    for alg, ix in cols.variants:
        if descriptor_violation(alg, problem) is not None:
            ok[ix] = False
    return ok
