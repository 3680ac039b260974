"""Torch entry points of grouped convolution: ``conv1d``, ``conv2d``, ``conv3d``, through the Dispatcher.

They take torch's tensors as ``torch.nn.functional.conv*d`` does: input
(N, C, *spatial) and weight (K, C/groups, *filter), in the default
(NCHW / NCDHW) memory format or channels-last.  The memory format picks the
problem's layout family (``ngchw`` or ``nhwgc``), so neither is copied into
the other here; the result comes back in the input's memory format.

Forward, bwd_data and bwd_weight are the torch custom ops ``ck::conv``,
``ck::conv_bwd_data`` and ``ck::conv_bwd_weight`` (fake implementations for
``torch.compile``); the forward's autograd runs the other two, each a
:class:`ConvProblem` through the Dispatcher of the tensors' device.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from ck_core import api as core
from ck_core import warm
from ck_core.errors import InvalidProblem
from ck_core.plugins import get_manager

from .problem import IN_NAMES, LAYOUT_FAMILIES, ConvProblem


def _is_channels_last(x: torch.Tensor) -> bool:
    """Channels innermost (NHWC / NDHWC storage) and not also plainly contiguous."""
    return x.shape[1] > 1 and x.stride(1) == 1 and not x.is_contiguous()


def _int(x, what: str) -> int:
    """``x`` as an int when it is one (int, numpy or 0-d torch integer); anything else, such as 1.5
    (which int() would truncate) or True, is refused."""
    import operator

    if isinstance(x, bool):
        raise InvalidProblem(f"{what}={x!r}: give an integer, not a bool")
    try:
        return operator.index(x)
    except TypeError:
        raise InvalidProblem(f"{what}={x!r} is not an integer; give integers") from None


def _tuple(v, nd: int, what: str) -> tuple:
    if isinstance(v, str):
        raise InvalidProblem(f"{what}={v!r}: give integers (string paddings such as 'same' are not supported)")
    if isinstance(v, (list, tuple)):
        t = tuple(_int(x, what) for x in v)
    else:
        t = (_int(v, what),) * nd
    if len(t) == 1 and nd > 1:
        t = t * nd
    if len(t) != nd:
        raise InvalidProblem(f"{what}={tuple(v)} has {len(t)} entries; give 1 or {nd}")
    return t


def _problem(direction: str, x_shape, w_shape, stride, padding, dilation, groups: int,
             dtype: torch.dtype, channels_last: bool) -> ConvProblem:
    nd = len(x_shape) - 2
    n, c, *spatial = x_shape
    k, c_per_group, *filt = w_shape
    if len(w_shape) != nd + 2:
        raise InvalidProblem(f"conv{nd}d: weight is {tuple(w_shape)}; expected (out_channels, "
                             f"in_channels/groups, {nd} filter sizes)")
    if c != c_per_group * groups:
        raise InvalidProblem(f"conv{nd}d: input has {c} channels but weight {tuple(w_shape)} with groups={groups} "
                             f"expects {c_per_group * groups}")
    fam = "nhwgc" if channels_last else "ngchw"
    in_l, wei_l, out_l = LAYOUT_FAMILIES[fam][nd]
    pad = _tuple(padding, nd, "padding")
    return ConvProblem(N=n, G=groups, C=c, K=k, input_spatial=tuple(spatial), filter=tuple(filt),
                       stride=_tuple(stride, nd, "stride"), dilation=_tuple(dilation, nd, "dilation"),
                       pad_left=pad, pad_right=pad, direction=direction, dtype=core.dtype_token(dtype),
                       in_layout=in_l, wei_layout=wei_l, out_layout=out_l,
                       split_k=0)   # any split: the Dispatcher picks the kernel and its split


def _last(nd: int) -> tuple:
    """Permutation of (N, C, *spatial) to (N, *spatial, C)."""
    return (0, *range(2, nd + 2), 1)


def _first(nd: int) -> tuple:
    """Permutation of (N, *spatial, C) back to (N, C, *spatial)."""
    return (0, nd + 1, *range(1, nd + 1))


def _image_in(t: torch.Tensor, groups: int, cl: bool) -> torch.Tensor:
    """(N, C, *spatial) -> NHWGC (channels last) or NGCHW storage."""
    n, c, *sp = t.shape
    if cl:
        return t.permute(_last(len(sp))).contiguous().view(n, *sp, groups, c // groups)
    return t.contiguous().view(n, groups, c // groups, *sp)


def _weight_in(w: torch.Tensor, groups: int, cl: bool) -> torch.Tensor:
    """(K, C/G, *filter) -> GKYXC (channels last) or GKCYX storage."""
    k, cg, *flt = w.shape
    if cl:
        return w.permute(_last(len(flt))).contiguous().view(groups, k // groups, *flt, cg)
    return w.contiguous().view(groups, k // groups, cg, *flt)


def _nc_out(t: torch.Tensor, shape, cl: bool) -> torch.Tensor:
    """Problem storage -> torch's (N|K, C, *spatial) view, channels-last strides when ``cl``."""
    lead, ch, *sp = shape
    if cl:
        return t.reshape(lead, *sp, ch).permute(_first(len(sp)))
    return t.reshape(shape)


def _empty(shape, cl: bool, like: torch.Tensor) -> torch.Tensor:
    lead, ch, *sp = shape
    if cl:
        return like.new_empty((lead, *sp, ch)).permute(_first(len(sp)))
    return like.new_empty(tuple(shape))


def _run(problem: ConvProblem, like: torch.Tensor, tensors: dict, out_shape, cl: bool) -> torch.Tensor:
    disp = core.dispatcher_on("conv", like, directions=(problem.direction,), dtypes=(problem.dtype,),
                              ndims=(problem.ndim,), layouts=(problem.layout_family,))
    out = core.run(disp, problem, tensors, device=like.device, dtype=like.dtype)
    return _nc_out(out, out_shape, cl)


def _out_shape(p: ConvProblem) -> tuple:
    return (p.N, p.K, *p.output_spatial)


# -- the custom ops ----------------------------------------------------------------

def _forward(x, w, stride, padding, dilation, groups: int, sig=None) -> torch.Tensor:
    """The forward's cold path; with ``sig`` (a warm-call signature of these arguments)
    it also stores the closure that repeats this call."""
    cl = _is_channels_last(x)
    p = _problem("forward", x.shape, w.shape, stride, padding, dilation, groups, x.dtype, cl)
    tensors = {"x": _image_in(x, groups, cl), "w": _weight_in(w, groups, cl)}
    disp = core.dispatcher_on("conv", x, directions=(p.direction,), dtypes=(p.dtype,), ndims=(p.ndim,),
                              layouts=(p.layout_family,))
    y = _nc_out(core.run(disp, p, tensors, device=x.device, dtype=x.dtype), _out_shape(p), cl)
    if sig is not None:
        warm.put(sig, _warm_closure(disp, p, tensors, x, w, groups, cl))
    return y


def _prep(name: str):
    """The problem storage of an operand named ``name`` (``x``/``dy``: images, ``w``: filters)."""
    return _weight_in if name == "w" else _image_in


def _warm_closure(disp, p: ConvProblem, tensors: dict, a, b, groups: int, cl: bool, out_shape=None):
    """``f(a, b) -> out`` repeating a call of ``p``'s direction with this signature (``a``, ``b``: the
    direction's operands in torch's form, IN_NAMES order): the launcher's recorded replay where it has
    one, else the cached Problem on the cached Dispatcher."""
    out_shape = _out_shape(p) if out_shape is None else tuple(out_shape)
    dev = a.device
    na, nb = IN_NAMES[p.direction]
    pa, pb = _prep(na), _prep(nb)
    fast = disp.warm(p, tensors)
    if fast is not None:
        if getattr(fast, "pointers_only", False) and tensors[na].data_ptr() == a.data_ptr() \
                and tensors[nb].data_ptr() == b.data_ptr():
            # the problem's operands are views of a and b (the signature pins their strides)
            if cl:   # what _nc_out does, with its shapes worked out once
                lead, ch, *sp = out_shape
                view, perm = (lead, *sp, ch), _first(len(sp))
                return lambda a, b: fast(a, b).reshape(view).permute(perm)
            return lambda a, b: fast(a, b).reshape(out_shape)
        return lambda a, b: _nc_out(fast(pa(a, groups, cl), pb(b, groups, cl)), out_shape, cl)

    def again(a, b):
        ts = {na: pa(a, groups, cl), nb: pb(b, groups, cl)}
        return _nc_out(core.run(disp, p, ts, device=dev, dtype=a.dtype), out_shape, cl)

    return again


def _stage(direction: str, a, b, x_shape, w_shape, args: tuple, cl: bool) -> tuple:
    """(closure ``f(a, b) -> out`` for operands like ``a``, ``b``, this call's ``out``): one cold call
    of ``direction`` (``a``, ``b`` in IN_NAMES order, torch's form) through the Dispatcher."""
    stride, padding, dilation, groups = args
    p = _problem(direction, x_shape, w_shape, stride, padding, dilation, groups, a.dtype, cl)
    na, nb = IN_NAMES[direction]
    tensors = {na: _prep(na)(a, groups, cl), nb: _prep(nb)(b, groups, cl)}
    out_shape = {"forward": _out_shape(p), "bwd_data": tuple(x_shape), "bwd_weight": tuple(w_shape)}[direction]
    disp = core.dispatcher_on("conv", a, directions=(direction,), dtypes=(p.dtype,), ndims=(p.ndim,),
                              layouts=(p.layout_family,))
    out = _nc_out(core.run(disp, p, tensors, device=a.device, dtype=a.dtype), out_shape, cl)
    return _warm_closure(disp, p, tensors, a, b, groups, cl, out_shape), out


@torch.library.custom_op("ck::conv", mutates_args=())
def conv_op(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int],
            groups: int) -> torch.Tensor:
    """Grouped convolution forward through the Dispatcher (the custom op ``ck::conv``)."""
    return _forward(x, w, stride, padding, dilation, groups)


@conv_op.register_fake
def _(x, w, stride, padding, dilation, groups):
    cl = _is_channels_last(x)
    p = _problem("forward", x.shape, w.shape, stride, padding, dilation, groups, x.dtype, cl)
    return _empty(_out_shape(p), cl, x)


@torch.library.custom_op("ck::conv_bwd_data", mutates_args=())
def conv_bwd_data_op(dy: torch.Tensor, w: torch.Tensor, x_shape: list[int], stride: list[int],
                     padding: list[int], dilation: list[int], groups: int, channels_last: bool) -> torch.Tensor:
    """The input gradient of ``ck::conv`` (a bwd_data problem through the Dispatcher)."""
    p = _problem("bwd_data", x_shape, w.shape, stride, padding, dilation, groups, dy.dtype, channels_last)
    return _run(p, dy, {"dy": _image_in(dy, groups, channels_last), "w": _weight_in(w, groups, channels_last)},
                tuple(x_shape), channels_last)


@conv_bwd_data_op.register_fake
def _(dy, w, x_shape, stride, padding, dilation, groups, channels_last):
    return _empty(tuple(x_shape), channels_last, dy)


@torch.library.custom_op("ck::conv_bwd_weight", mutates_args=())
def conv_bwd_weight_op(x: torch.Tensor, dy: torch.Tensor, w_shape: list[int], stride: list[int],
                       padding: list[int], dilation: list[int], groups: int, channels_last: bool) -> torch.Tensor:
    """The weight gradient of ``ck::conv`` (a bwd_weight problem through the Dispatcher)."""
    p = _problem("bwd_weight", x.shape, w_shape, stride, padding, dilation, groups, x.dtype, channels_last)
    return _run(p, x, {"x": _image_in(x, groups, channels_last), "dy": _image_in(dy, groups, channels_last)},
                tuple(w_shape), channels_last)


@conv_bwd_weight_op.register_fake
def _(x, dy, w_shape, stride, padding, dilation, groups, channels_last):
    return _empty(tuple(w_shape), channels_last, x)


def _setup(ctx, inputs, output):
    x, w, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, w)
    ctx.args = (list(stride), list(padding), list(dilation), groups, _is_channels_last(x))


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    stride, padding, dilation, groups, cl = ctx.args
    dx = dw = None
    if ctx.needs_input_grad[0]:
        dx = conv_bwd_data_op(dy, w, list(x.shape), stride, padding, dilation, groups, cl)
    if ctx.needs_input_grad[1]:
        dw = conv_bwd_weight_op(x, dy, list(w.shape), stride, padding, dilation, groups, cl)
    return dx, dw, None, None, None, None


conv_op.register_autograd(_backward, setup_context=_setup)


class _Eager(torch.autograd.Function):
    """The forward with autograd in eager mode, without the custom-op layer: the forward is the warm
    closure of its signature's :class:`ck_core.warm.Entry` (kept by the context), the backward looks
    its closures (bwd_data, bwd_weight) up in that Entry by the gradient's signature, built on the
    first backward step of a signature.  ``torch.compile`` traces the custom op instead."""

    @staticmethod
    def forward(ctx, entry, x, w):
        ctx.save_for_backward(x, w)
        ctx.entry = entry
        f = entry.fwd
        if f is not None:
            return f(x, w)   # grad mode is off here
        args, cl = entry.extra
        entry.fwd, y = _stage("forward", x, w, x.shape, w.shape, args, cl)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        entry = ctx.entry
        args, cl = entry.extra
        if torch.is_grad_enabled():   # a graph of the backward (create_graph): the custom ops record it
            stride, padding, dilation, groups = args
            view = SimpleNamespace(saved_tensors=(x, w), args=(stride, padding, dilation, groups, cl),
                                   needs_input_grad=need[1:])
            return (None, *_backward(view, dy)[:2])
        key = (dy.shape, dy.stride(), dy.dtype, dy.data_ptr() % 16, need[1], need[2])
        f = entry.bwd.get(key)
        if f is not None:
            fd, fw = f
            return None, fd(dy, w) if fd is not None else None, fw(x, dy) if fw is not None else None
        fd = fw = dx = dw = None
        if need[1]:
            fd, dx = _stage("bwd_data", dy, w, x.shape, w.shape, args, cl)
        if need[2]:
            fw, dw = _stage("bwd_weight", x, dy, x.shape, w.shape, args, cl)
        if len(entry.bwd) > 64:
            entry.bwd.clear()
        entry.bwd[key] = (fd, fw)
        return None, dx, dw


# -- the public functions -------------------------------------------------------------

#: the first field of the forward's warm-call signatures
_CONV = "ck_conv.conv"
_CONV_ENTRY = "ck_conv.conv/autograd"
_apply = _Eager.apply
_compiling, _grad_enabled, _warm_get = torch.compiler.is_compiling, torch.is_grad_enabled, warm.get


def _conv(nd: int, x, w, bias, stride, padding, dilation, groups):
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
            and (bias is None or isinstance(bias, torch.Tensor))):
        raise InvalidProblem(f"conv{nd}d takes torch tensors (input, weight, bias), got {type(x).__name__}, "
                             f"{type(w).__name__}, {type(bias).__name__} (convert numpy arrays with torch.from_numpy)")
    sig = None
    if x.dim() == nd + 2 and not _compiling():
        grad = _grad_enabled() and (x.requires_grad or w.requires_grad)
        # a known signature skips the Problem, its checks and the Dispatcher; per tensor the
        # fields of ck_core.warm.tensor_sig, flat (with autograd: the signature's Entry)
        sig = (_CONV_ENTRY if grad else _CONV, get_manager(), nd, x.shape, x.stride(), x.dtype, x.device,
               x.data_ptr() % 16, w.shape, w.stride(), w.dtype, w.device, w.data_ptr() % 16,
               tuple(stride) if isinstance(stride, list) else stride,
               tuple(padding) if isinstance(padding, list) else padding,
               tuple(dilation) if isinstance(dilation, list) else dilation, groups)
        f = _warm_get(sig)
        if f is not None:
            y = _apply(f, x, w) if grad else f(x, w)
            return y if bias is None else y + bias.view(1, -1, *([1] * nd))
    if x.dim() == nd + 2 and not _is_channels_last(x) and x.numel() // max(x.shape[1], 1) * w.numel() > _in_place():
        # a large NCHW call: the kernels run on channels-last copies (their vectorised loads), the result
        # comes back NCHW (torch's layout for NCHW input); small ones read NCHW in place (no copies).
        # (One channel or one pixel: channels-last is the same memory, nothing to copy.)
        xl = _to_last(x)
        if _is_channels_last(xl):
            return _conv(nd, xl, _to_last(w), bias, stride, padding, dilation, groups).contiguous()
    if x.dim() == nd + 1:   # unbatched, as torch allows
        return _conv(nd, x.unsqueeze(0), w, bias, stride, padding, dilation, groups).squeeze(0)
    if x.dim() != nd + 2:
        raise InvalidProblem(f"conv{nd}d takes a {nd + 2}-D input (N, C, {nd} spatial sizes) or an "
                             f"unbatched {nd + 1}-D one, got {x.dim()}-D")
    if w.dtype != x.dtype or w.device != x.device:
        raise InvalidProblem(f"conv{nd}d: input is {x.dtype} on {x.device} but weight {w.dtype} on {w.device}")
    args = ([*_tuple(stride, nd, "stride")], [*_tuple(padding, nd, "padding")],
            [*_tuple(dilation, nd, "dilation")], _int(groups, "groups"))
    if not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        y = _forward(x, w, *args, sig=sig)   # no autograd record to keep: skip the op wrapper
    elif not torch.compiler.is_compiling():
        _problem("forward", x.shape, w.shape, *args, x.dtype, _is_channels_last(x))   # checks, before caching
        entry = warm.Entry(extra=(args, _is_channels_last(x)))
        warm.put(sig, entry)
        y = _apply(entry, x, w)
    else:
        y = conv_op(x, w, *args)
    if bias is not None:
        y = y + bias.view(1, -1, *([1] * nd))
    return y


def _to_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` (N|K, C, *spatial) with channels-last strides (a copy; any rank, conv1d's too)."""
    nd = t.dim() - 2
    return t.permute(_last(nd)).contiguous().permute(_first(nd))


@torch.compiler.assume_constant_result   # (read on the host: under torch.compile the traced call sees a constant)
def _in_place() -> int:
    if not _IN_PLACE:
        from .heuristics import nchw_in_place_limit

        _IN_PLACE.append(nchw_in_place_limit())
    return _IN_PLACE[0]


#: the tuned bound of NCHW calls that run in place (read once; ck_core.api.clear() forgets it)
_IN_PLACE: list = []
core.on_clear(_IN_PLACE.clear)


def conv1d(x, w, bias: Optional[torch.Tensor] = None, stride=1, padding=0, dilation=1, groups: int = 1):
    """Like ``torch.nn.functional.conv1d``, on the Dispatcher's kernels."""
    return _conv(1, x, w, bias, stride, padding, dilation, groups)


def conv2d(x, w, bias: Optional[torch.Tensor] = None, stride=1, padding=0, dilation=1, groups: int = 1):
    """Like ``torch.nn.functional.conv2d``, on the Dispatcher's kernels."""
    return _conv(2, x, w, bias, stride, padding, dilation, groups)


def conv3d(x, w, bias: Optional[torch.Tensor] = None, stride=1, padding=0, dilation=1, groups: int = 1):
    """Like ``torch.nn.functional.conv3d``, on the Dispatcher's kernels."""
    return _conv(3, x, w, bias, stride, padding, dilation, groups)
