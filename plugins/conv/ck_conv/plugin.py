"""Hook implementations of the grouped-conv op plugin (entry point group ``ck_core.ops``).

A conv KernelKey is ``KernelKey("conv", ConvSignature, ConvAlgorithm, arch, backend)``;
its body is :attr:`ck_conv.keys.ConvKernelConfig.name`, e.g.
``conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x128x32_2x2x1_32x32x16_default``.

Tensors by name: inputs ``x`` (input), ``w`` (weight), ``dy`` (output
gradient); outputs ``y`` (forward), ``dx`` (bwd_data), ``dw`` (bwd_weight).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import math
from pathlib import Path

import attrs
import numpy as np

from ck_core.dtypes import ATOL, RTOL, quantize
from ck_core.errors import ConfigError, InvalidProblem, UnsupportedProblem
from ck_core.hookspecs import hookimpl
from ck_core.key import KernelKey, RecordSchema
from ck_core.records import OpSpec

from . import keys as K
from .problem import DIRECTIONS, DTYPES, IN_NAMES, LAYOUT_FAMILIES, ConvProblem

OUT_NAME = {"forward": "y", "bwd_data": "dx", "bwd_weight": "dw"}


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
    split: int = 1

    @property
    def num_warps(self) -> int:
        return self.warp_m * self.warp_n * self.warp_k


@functools.lru_cache(maxsize=1 << 18)
def to_config(sig: ConvSignature, a: ConvAlgorithm) -> K.ConvKernelConfig:
    return K.ConvKernelConfig(direction=sig.direction, dtype=sig.dtype, ndim=sig.ndim, layout=sig.layout,
                              pipeline=a.pipeline, scheduler=a.scheduler, tile=(a.tile_m, a.tile_n, a.tile_k),
                              waves=(a.warp_m, a.warp_n, a.warp_k),
                              warp_tile=(a.warp_tile_m, a.warp_tile_n, a.warp_tile_k),
                              specialization=a.specialization, vector=(a.vector_a, a.vector_b, a.vector_c),
                              pad=(a.pad_m, a.pad_n, a.pad_k), stages=a.stages, reduction=a.reduction,
                              group_merge=a.group_merge, tap_mask=a.tap_mask, flat=a.flat,
                              rows=a.rows, split=a.split)


def from_config(c: K.ConvKernelConfig) -> tuple:
    sig = ConvSignature(c.direction, c.dtype, c.ndim, c.layout)
    alg = ConvAlgorithm(*c.tile, *c.waves, *c.warp_tile, pipeline=c.pipeline, scheduler=c.scheduler,
                        specialization=c.specialization, vector_a=c.vector[0], vector_b=c.vector[1],
                        vector_c=c.vector[2], pad_m=c.pad[0], pad_n=c.pad[1], pad_k=c.pad[2],
                        stages=c.stages, reduction=c.reduction, group_merge=c.group_merge, tap_mask=c.tap_mask,
                        flat=c.flat, rows=c.rows, split=c.split)
    return sig, alg


_DEFAULT_ALG = ConvAlgorithm(128, 128, 32, 2, 2, 1, 32, 32, 16)


def config_of(key) -> K.ConvKernelConfig:
    return to_config(key.signature, key.algorithm)


def key_of(cfg: K.ConvKernelConfig, arch: str, backend: str = "numpy") -> KernelKey:
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
    return from_config(K.ConvKernelConfig.from_name(body))


SIG_CHOICES = {"direction": DIRECTIONS, "dtype": DTYPES, "layout": tuple(LAYOUT_FAMILIES)}
ALG_CHOICES = {"pipeline": K.PIPELINES, "scheduler": K.SCHEDULERS, "specialization": K.SPECIALIZATIONS,
               "reduction": K.REDUCTIONS}
_SIZE = (1, 1 << 16)
ALG_BOUNDS = {**{f: _SIZE for f in ("tile_m", "tile_n", "tile_k", "warp_m", "warp_n", "warp_k", "warp_tile_m",
                                     "warp_tile_n", "warp_tile_k", "vector_a", "vector_b", "vector_c",
                                     "group_merge")},
              "stages": (0, max(K.STAGE_RANGE)), "rows": (0, 2)}


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
    why = K.cull_reason(c, warp_size=arch.warp_size, lds_bytes=arch.lds_bytes,
                        warp_tiles=dict(arch.warp_tiles).get(c.dtype, ()))
    if why is None and c.dtype not in arch.dtypes:
        why = f"{arch.name} has no {c.dtype} matrix instructions"
    if why is None and getattr(arch, "vendor", "") == "nvidia" and c.specialization != "depthwise":
        need = (c.tile[0] + c.tile[1]) * c.tile[2] * K.ELEMENT_BYTES[c.dtype] * c.smem_buffers
        if need > arch.lds_bytes:
            why = f"needs {need} B of shared memory, {arch.name} has {arch.lds_bytes} B"
    return why


# -- the kernel space ----------------------------------------------------------

OPTIONS = ("directions", "dtypes", "ndims", "layouts", "specializations", "pipelines", "tiles", "split_ks")
#: reduction splits enumerated per kind of kernel (``split_ks`` overrides them all):
#: CK-space atomic forward / bwd_data, the workspace reductions, bwd_weight's pixel split
#: (stream-K: persistent programs per SM)
SPLITS = {"atomic": (1, 2, 4, 8), "workspace": (1, 2, 4, 8), "bwd_weight": (1, 2, 4, 8, 16, 32),
          "streamk": (1, 2),
          # a depthwise bwd_weight launch has one program per 16-64 groups: a MobileNet layer
          # (G 32-384) fills an H100 only when its pixels are cut in a hundred parts or more
          "depthwise_bwd_weight": (1, 2, 4, 8, 16, 32, 64, 128, 256)}


def _splits(c: K.ConvKernelConfig, override) -> tuple:
    if c.reduction == "streamk":
        return SPLITS["streamk"]
    if c.flat or c.rows or (c.specialization == "depthwise" and c.direction != "bwd_weight"):
        return (1,)
    if override:
        return override
    if c.direction == "bwd_weight":
        return SPLITS["depthwise_bwd_weight" if c.specialization == "depthwise" else "bwd_weight"]
    return SPLITS["atomic" if c.reduction == "atomic" else "workspace"]


def key_space(arch, backend: str, options: dict):
    """The conv kernel space on ``arch`` as a KeySpace (:class:`ck_conv.keyspace.ConvSpace`)."""
    from .keyspace import ConvSpace

    return ConvSpace(arch, backend, options)


def enumerate_keys(arch, backend: str, options: dict) -> list:
    """Every key of :func:`key_space`, listed."""
    return list(key_space(arch, backend, options))


def shortlist(problem, arch, backend: str):
    """Two tiers of keys for ``problem``: its tuning list
    (:func:`ck_conv.keys.candidate_configs`: the heuristic pick first, then the classic
    and realisation variants that won on the H100), then the heuristic pick's kernel on
    each tile of CK's table (what a registry of CK's space alone holds).  Each config comes
    with the split that fills ``arch`` (as the launch makes it) and unsplit."""
    if not isinstance(problem, ConvProblem):
        return
    yield _with_splits(K.candidate_configs(problem, arch=arch), problem, arch, backend)
    yield _with_splits(_ck_table_variants(problem, arch), problem, arch, backend)   # only when the first misses


def _with_splits(cfgs, problem, arch, backend: str) -> list:
    from .heuristics import preferred_split
    from .backends.triton.launch import split_plan

    cus, smem = max(int(arch.compute_units or 1), 1), arch.lds_bytes
    out = []
    for c in cfgs:
        if problem.split_k:
            picks = (c if c.split == problem.split_k else attrs.evolve(c, split=problem.split_k),)
        else:
            c1 = c if c.split == 1 else attrs.evolve(c, split=1)
            sp = preferred_split(c1, problem, cus, smem)
            if sp > 1 and c1.reduction != "streamk":
                sp = split_plan(c1, problem, sp)[0]   # the parts the launch makes
                sp = _enumerated_split(c1, sp, problem)
            picks = (attrs.evolve(c1, split=sp), c1) if sp != 1 else (c1,)
        out.extend(key_of(x, arch.name, backend) for x in picks)
    return out


def _enumerated_split(c1: K.ConvKernelConfig, want: int, problem) -> int:
    """The split nearest ``want`` (log scale; the smaller on a tie) among those the enumeration
    gives ``c1`` (:func:`_splits`) that its launch makes as named on ``problem``; 1 if none.
    The preferred split is any integer (263 parts of a MobileNet layer's pixels), the key space
    holds powers of two: a shortlist naming a split outside it would name no key at all."""
    from .backends.triton.launch import split_plan

    for s in sorted(_splits(c1, ()), key=lambda s: (abs(math.log2(s / want)), s)):
        if s == 1 or split_plan(c1, problem, s)[0] == s:
            return s
    return 1


def _ck_table_variants(problem, arch) -> list:
    want = K.heuristic_config(problem, warp_size=arch.warp_size, big_smem=arch.lds_bytes > 100_000)
    if want.specialization == "depthwise":
        return [attrs.evolve(want, tile=t) for t in K.DEPTHWISE_TILES]
    tiles = dict(getattr(arch, "extras", {}).get("conv", {})).get("tiles") or K.DEFAULT_TILES
    waves = dict.fromkeys((want.waves, (2, 2, 1), (4, 1, 1), (2, 4, 1)))
    return [attrs.evolve(want, tile=tuple(t), waves=w) for t in tiles for w in waves]


def supports(key, problem) -> str | None:
    if not isinstance(problem, ConvProblem):
        return f"not a conv problem ({type(problem).__name__})"
    return config_of(key).why_not(problem)


def heuristic(problem, candidates, arch) -> list:
    """Rank candidates by closeness to :func:`ck_conv.keys.heuristic_config`'s pick."""
    from .heuristics import preferred_split

    want = K.heuristic_config(problem, warp_size=getattr(arch, "warp_size", 32),
                              big_smem=getattr(arch, "lds_bytes", 65536) > 100_000)
    cus = max(getattr(arch, "compute_units", 0) or 1, 1)
    spec_rank = {"depthwise": 0, "filter1x1_stride1_pad0": 0, "filter1x1_pad0": 1, "filter3x3": 2, "default": 3}

    def score(k):
        c = config_of(k)
        s = sum(abs(math.log2(a / b)) for a, b in zip(c.tile, want.tile))
        s += 0.5 * (c.pipeline != want.pipeline) + 0.25 * (c.waves != want.waves)
        s += 0.1 * spec_rank.get(c.specialization, 3) + 0.05 * (c.warp_tile != want.warp_tile)
        # the split that fills the GPU for this tile (the launcher never sizes one)
        s += 0.3 * abs(math.log2(c.split / split_for(c)))
        return s

    preferred: dict = {}

    def split_for(c):
        # what the preferred split depends on (not the split itself): one computation per family
        fam = (c.tile, c.group_merge, c.tap_mask, c.reduction, c.stages, c.pipeline, c.flat, c.rows,
               c.specialization)
        if fam not in preferred:
            preferred[fam] = preferred_split(c, problem, cus, getattr(arch, "lds_bytes", None))
        return preferred[fam]

    return sorted(candidates, key=score)   # the Dispatcher passes the keys that support the problem


# -- references and inputs -------------------------------------------------------

def reference(problem: ConvProblem, tensors: dict) -> dict:
    from .reference import reference as ref
    ops = {n: np.asarray(tensors[n]) for n in IN_NAMES[problem.direction]}
    return {OUT_NAME[problem.direction]: ref(problem, ops)}


def make_inputs(problem: ConvProblem, rng: np.random.Generator) -> dict:
    shapes = {"x": problem.input_shape, "w": problem.weight_shape, "dy": problem.output_shape}
    out = {}
    for n in IN_NAMES[problem.direction]:
        scale = 1.0 / math.sqrt(problem.c_per_group * problem.taps) if n == "w" else 1.0
        out[n] = quantize(rng.uniform(-1.0, 1.0, shapes[n]) * scale, problem.dtype)
    return out


def tolerance(problem: ConvProblem) -> dict:
    # long reductions in fp16/bf16 round more than one GEMM step: widen with the depth
    m, n, k = problem.gemm_mnk
    grow = max(1.0, math.sqrt(k / 256.0))
    name = OUT_NAME[problem.direction]
    return {name: (RTOL[problem.dtype] * grow, ATOL[problem.dtype] * grow)}


def _numpy_impl(key, problem, tensors):
    if supports(key, problem):
        raise UnsupportedProblem(f"{key.name} cannot run {problem}: {supports(key, problem)}")
    out = reference(problem, tensors)
    return {k: quantize(v, problem.dtype) for k, v in out.items()}


def _triton_impl(key, arch):
    import torch
    from ck_core.backends.triton_artifacts import compile_options
    from .backends.triton.launch import run

    cfg = config_of(key)
    extra = compile_options(key)
    td = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[cfg.dtype]

    from ck_core.backends import triton_replay
    from ck_core.warm import tensor_sig
    from .backends.triton.launch import Capture

    # replays recorded per (problem, operand signature); False: recorded, not replayable
    recorded: dict = {}

    def launch(problem, tensors):
        names = IN_NAMES[problem.direction]
        ops = {}
        for n in names:
            t = tensors[n]
            ops[n] = t if t.dtype == td else t.to(td)  # numpy storage (float32 for bf16) via to_backend
        out_name = OUT_NAME[problem.direction]
        first = ops[names[0]]
        if problem.direction != "forward" or not triton_replay.replayable(first) \
                or any(tensors[n] is not ops[n] for n in names):
            return {out_name: run(problem, ops, cfg, num_sms=arch.compute_units, kernel_name=key.name,
                                  compile_options=extra)}
        sig = (problem, *[tensor_sig(ops[n]) for n in names])
        rec = recorded.get(sig)
        if rec:
            return {out_name: rec(*[ops[n] for n in names])}
        if rec is False:
            return {out_name: run(problem, ops, cfg, num_sms=arch.compute_units, kernel_name=key.name,
                                  compile_options=extra)}
        cap = Capture()
        with cap.recording():
            out = run(problem, ops, cfg, num_sms=arch.compute_units, kernel_name=key.name, compile_options=extra)
        recorded[sig] = cap.replayer(problem, out) or False
        return {out_name: out}

    def warm(problem, tensors):
        """``f(x, w) -> y`` (problem layouts) for calls like a recorded one, or None."""
        names = IN_NAMES[problem.direction]
        if set(tensors) != set(names):
            return None
        return recorded.get((problem, *[tensor_sig(tensors[n]) for n in names])) or None

    launch.warm = warm
    return launch


def implement(key, backend: str, arch):
    if backend == "numpy":
        return lambda problem, tensors: _numpy_impl(key, problem, tensors)
    if backend == "triton":
        return _triton_impl(key, arch)
    raise UnsupportedProblem(f"the conv plugin has no {backend!r} implementation; use backend numpy or triton")


# -- ahead-of-time -------------------------------------------------------------

@attrs.frozen
class ConvRendered:
    """A Triton kernel ready for ``triton.compile(ASTSource(...), target=...)``."""

    fn: object
    signature: dict
    constexprs: dict
    attrs_: dict
    options: dict
    source_hash: str
    #: the key's launches on a representative problem (:func:`jit_calls`), which ``ck build``
    #: compiles into the entries the launcher loads; None: no such problem was found
    jit_calls: object = None

    def compile(self, target, extra_options=None):
        import triton
        from triton.compiler import ASTSource

        opts = dict(self.options, **(extra_options or {}))
        return triton.compile(ASTSource(self.fn, self.signature, self.constexprs, self.attrs_),
                              target=target, options=opts)


def render(key, backend: str):
    if backend != "triton":
        raise UnsupportedProblem(f"conv has no {backend} templates; use backend triton")
    from .backends.triton import kernels as triton_kernels
    from .backends.triton.launch import aot_source_args

    fn, sig, consts, opts = aot_source_args(config_of(key))
    attrs_ = opts.pop("attrs")
    try:
        src = inspect.getsource(triton_kernels) + fn.src
    except (OSError, AttributeError):  # generated kernels carry their own source
        src = getattr(fn, "src", repr(fn))
    h = hashlib.sha256((src + repr(sorted(consts.items())) + repr(sig) + repr(sorted(opts.items())))
                       .encode()).hexdigest()
    rep = _representative(config_of(key))
    return ConvRendered(fn, sig, consts, attrs_, opts, h,
                        None if rep is None else functools.partial(jit_calls, key, rep))


#: representative problems, tried in order: (G, C, K, filter, pad); the wide ones for kernels
#: whose split needs a long reduction to run as named.  Channels multiples of 16
#: (Triton specialises integers divisible by 16), N = 4 and spatial size 28, as common
#: CNN layers have (56, 28, 14, 7: not multiples of 16, nor 1)
_REPRESENTATIVE = ((1, 64, 64, 3, 1), (1, 64, 64, 1, 0), (64, 64, 64, 3, 1), (8, 128, 128, 3, 1),
                   (8, 128, 128, 1, 0), (4, 256, 256, 3, 1), (4, 256, 256, 1, 0), (64, 64, 64, 5, 2),
                   (64, 64, 64, 7, 3), (1, 512, 512, 3, 1), (1, 512, 512, 1, 0), (1, 4096, 4096, 3, 1),
                   (1, 4096, 4096, 1, 0))
_REP_N, _REP_SPATIAL = 4, 28


def _representative(cfg) -> ConvProblem | None:
    """The first representative problem ``cfg`` runs as it is, or None."""
    i_l, w_l, o_l = cfg.layouts
    for g, c, k, f, pad in _REPRESENTATIVE:
        try:
            p = ConvProblem(N=_REP_N, G=g, C=c, K=k, input_spatial=(_REP_SPATIAL,) * cfg.ndim,
                            filter=(f,) * cfg.ndim, pad_left=(pad,) * cfg.ndim, pad_right=(pad,) * cfg.ndim,
                            direction=cfg.direction, dtype=cfg.dtype, in_layout=i_l, wei_layout=w_l, out_layout=o_l)
        except InvalidProblem:   # (a layout family without this problem): try the next
            continue
        if cfg.why_not(p) is None:
            return p
    return None


def jit_calls(key, problem: ConvProblem) -> list:
    """The launches of ``key``'s launcher on ``problem`` (:func:`_representative`),
    ``[(suffix, fn, args, kwargs)]``; tensors on torch's meta device (nothing runs)."""
    import torch
    from ck_core.plugins import get_manager

    from .backends.triton.launch import run

    td = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[problem.dtype]
    shapes = {"x": problem.input_shape, "w": problem.weight_shape, "dy": problem.output_shape}
    tensors = {n: torch.empty(shapes[n], dtype=td, device="meta") for n in IN_NAMES[problem.direction]}
    calls: list = []
    run(problem, tensors, config_of(key), num_sms=get_manager().arch(key.arch).compute_units,
        kernel_name=key.name, capture=calls)
    return calls


def _flops(p):
    return float(p.flops)


def _bytes(p):
    from ck_core.dtypes import ELEMENT_BYTES
    n = math.prod(p.input_shape) + math.prod(p.weight_shape) + math.prod(p.output_shape)
    return float(n * ELEMENT_BYTES[p.dtype])


def _working_bytes(p, backend):
    """The numpy backend's float64 working set beyond the tensors: the padded input, the weight,
    the output or gradient, the einsum temporary and the copy back into the problem's layout."""
    if backend != "numpy":
        return 0.0
    padded = p.N * p.C * math.prod(i + lo + hi for i, lo, hi in zip(p.input_spatial, p.pad_left, p.pad_right))
    result = {"forward": p.output_shape, "bwd_data": p.input_shape, "bwd_weight": p.weight_shape}[p.direction]
    return 8.0 * (padded + math.prod(p.weight_shape) + math.prod(p.output_shape) + 2 * math.prod(result))


def _features(problem, candidates, arch):
    from .features import features

    return features(problem, candidates, arch)


def _bench(peer, options):
    if options.get("suite", "core") == "broad":
        from .bench_broad import bench
    else:
        from .bench import bench

    return bench(peer, options)


def conv_op() -> OpSpec:
    return OpSpec(
        name="conv",
        problem_type=ConvProblem,
        tuning_data=str(Path(__file__).resolve().parent / "tuned"),
        enumerate=enumerate_keys,
        key_space=key_space,
        shortlist=shortlist,
        format_name=format_name,
        parse_name=parse_name,
        from_fields=from_fields,
        legal=legal,
        supports=supports,
        reference=reference,
        make_inputs=make_inputs,
        implement=implement,
        input_names=("x", "w", "dy"),
        output_names=("y", "dx", "dw"),
        flops=_flops,
        bytes_moved=_bytes,
        working_bytes=_working_bytes,
        heuristic=heuristic,
        features=_features,
        render=render,
        bench=_bench,
        tolerance=tolerance,
        families=("implicit_gemm", "depthwise"),
        options={
            "directions": "forward, bwd_data, bwd_weight (default: all three)",
            "dtypes": "fp16, bf16, fp32 (default: those the arch runs)",
            "ndims": "spatial ranks 1, 2, 3 (default: all)",
            "layouts": "nhwgc, ngchw, gnhwc (default nhwgc)",
            "specializations": "CK's conv specialisations (default, filter1x1 ...) (default: all)",
            "pipelines": "mem, compv3, compv4 (default: the arch's)",
            "tiles": "block tiles as M,N,K triples (default: CK's table)",
            "split_ks": "reduction splits of the split-reduction kernels, e.g. 1,2,4 (default: per kind)",
        },
        description="grouped convolution 1D/2D/3D: forward, bwd_data, bwd_weight (CK layouts NHWGC/GKYXC/NHWGK)",
    )


@hookimpl
def ck_register_ops():
    return [conv_op()]


@hookimpl
def ck_sweep_spec(op):
    if op.name == "conv":
        from .sweep import sweep_spec

        return sweep_spec()
    return None
