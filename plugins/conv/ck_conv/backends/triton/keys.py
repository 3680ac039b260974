"""The triton backend's side of the conv keys: the launcher of a key (with warm-call replays),
its ahead-of-time rendering for ``ck build`` and the representative problem whose launches
``ck build`` compiles."""
from __future__ import annotations

import functools
import hashlib
import inspect

import attrs

from ck_core.errors import InvalidProblem, UnsupportedProblem

from ...keys import config_of
from ...problem import IN_NAMES, OUT_NAME, ConvProblem


def make_launcher(key, arch):
    """The launcher of ``key`` on ``arch``: ``(problem, tensors) -> {output name: tensor}``."""
    import torch
    from ck_core.backends.triton_artifacts import compile_options
    from .launch import run

    cfg = config_of(key)
    extra = compile_options(key)
    td = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[cfg.dtype]

    from ck_core.backends import triton_replay
    from ck_core.warm import tensor_sig
    from .warm import Capture

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
        if not triton_replay.replayable(first) or any(tensors[n] is not ops[n] for n in names):
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
    from . import kernels as triton_kernels
    from .aot import aot_source_args

    fn, sig, consts, opts = aot_source_args(config_of(key))
    attrs_ = opts.pop("attrs")
    try:
        src = inspect.getsource(triton_kernels) + fn.src
    except (OSError, AttributeError):  # generated kernels carry their own source
        src = getattr(fn, "src", repr(fn))
    h = hashlib.sha256((src + repr(sorted(consts.items())) + repr(sig) + repr(sorted(opts.items())))
                       .encode()).hexdigest()
    reps = _representatives(config_of(key))
    return ConvRendered(fn, sig, consts, attrs_, opts, h,
                        functools.partial(_jit_calls_all, key, reps) if reps else None)


#: representative problems, tried in order: (G, C, K, filter, pad); the wide ones for kernels
#: whose split needs a long reduction to run as named.  Channels multiples of 16
#: (Triton specialises integers divisible by 16), N = 4 and spatial size 28, as common
#: CNN layers have (56, 28, 14, 7: not multiples of 16, nor 1)
_REPRESENTATIVE = ((1, 64, 64, 3, 1), (1, 64, 64, 1, 0), (64, 64, 64, 3, 1), (8, 128, 128, 3, 1),
                   (8, 128, 128, 1, 0), (4, 256, 256, 3, 1), (4, 256, 256, 1, 0), (64, 64, 64, 5, 2),
                   (64, 64, 64, 7, 3), (1, 512, 512, 3, 1), (1, 512, 512, 1, 0), (1, 4096, 4096, 3, 1),
                   (1, 4096, 4096, 1, 0))
_REP_N, _REP_SPATIAL = 4, 28


def _representative(cfg, ragged: bool = False) -> ConvProblem | None:
    """The first representative problem ``cfg`` runs as it is, or None.  ``ragged``: its
    channels per group 16 more (still the 16-aligned class, but not whole K tiles: the
    launcher's EVEN_C / EVEN_K, the size-derived constexprs, are False)."""
    i_l, w_l, o_l = cfg.layouts
    for g, c, k, f, pad in _REPRESENTATIVE:
        if ragged:
            if c == g:   # depthwise: no channel reduction to split into tiles
                continue
            c, k = c + 16 * g, k + 16 * g
        try:
            p = ConvProblem(N=_REP_N, G=g, C=c, K=k, input_spatial=(_REP_SPATIAL,) * cfg.ndim,
                            filter=(f,) * cfg.ndim, pad_left=(pad,) * cfg.ndim, pad_right=(pad,) * cfg.ndim,
                            direction=cfg.direction, dtype=cfg.dtype, in_layout=i_l, wei_layout=w_l, out_layout=o_l)
        except InvalidProblem:   # (a layout family without this problem): try the next
            continue
        if cfg.why_not(p) is None:
            return p
    return None


def _representatives(cfg) -> list:
    """What ``ck build`` traces for ``cfg``: sizes and geometry are run-time integers and channels
    only their alignment class (kernels.py), so the representative and, where the key runs one,
    its ragged-channel twin (EVEN_C / EVEN_K False) cover every problem of 16-aligned channels."""
    return [p for p in (_representative(cfg), _representative(cfg, ragged=True)) if p is not None]


def _jit_calls_all(key, problems) -> list:
    return [c for p in problems for c in jit_calls(key, p)]


def jit_calls(key, problem: ConvProblem) -> list:
    """The launches of ``key``'s launcher on ``problem`` (:func:`_representative`),
    ``[(suffix, fn, args, kwargs)]``; tensors on torch's meta device (nothing runs)."""
    import torch
    from ck_core.plugins import get_manager

    from .launch import run

    td = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[problem.dtype]
    shapes = {"x": problem.input_shape, "w": problem.weight_shape, "dy": problem.output_shape}
    tensors = {n: torch.empty(shapes[n], dtype=td, device="meta") for n in IN_NAMES[problem.direction]}
    calls: list = []
    run(problem, tensors, config_of(key), num_sms=get_manager().arch(key.arch).compute_units,
        kernel_name=key.name, capture=calls)
    return calls
