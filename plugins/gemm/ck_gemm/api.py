"""Torch entry points of GEMM: ``matmul`` and ``linear``, through the Dispatcher.

Each call builds a :class:`GemmProblem` from the tensors (A and B in the
storage they already have: a transposed view is a column-major operand, not a
copy) and runs it through the Dispatcher of the tensors' device
(:func:`ck_core.api.dispatcher_on`).  The op is the torch custom op
``ck::gemm`` with a fake implementation and autograd, so ``torch.compile``
traces it without graph breaks; its backward is two more ``ck::gemm`` calls.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Optional, Sequence

import torch

from ck_core import api as core
from ck_core import warm
from ck_core.errors import InvalidProblem
from ck_core.plugins import get_manager
from ck_core.warm import grad_sig, tensor_sig

from .problem import ACTIVATIONS, DEFAULT_C, GemmProblem, pack_b


def _operand(t: torch.Tensor) -> tuple:
    """(layout letter, tensor in storage order) of a logical (.., rows, cols) operand.

    The stored tensor is contiguous with a 16-byte aligned base: what the
    Dispatcher's ``supports()`` assumes of a problem's operands (TMA keys)."""
    rows, cols = t.shape[-2:]
    if t.stride(-1) == 1 and (rows == 1 or t.stride(-2) >= max(cols, 1)):
        return "r", _aligned(t.contiguous())
    if t.stride(-2) == 1 and (cols == 1 or t.stride(-1) >= max(rows, 1)):
        return "c", _aligned(t.transpose(-1, -2).contiguous())
    return "r", _aligned(t.contiguous())


def _aligned(t: torch.Tensor) -> torch.Tensor:
    return t.clone() if t.data_ptr() % 16 else t


def _out_dtype(a: torch.Tensor, out_dtype) -> torch.dtype:
    return out_dtype if out_dtype is not None else core.torch_dtype(DEFAULT_C[core.dtype_token(a.dtype)])


def _shapes(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """(batch, M, N, K) of ``a @ b``; InvalidProblem says what does not fit."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise InvalidProblem(f"matmul takes 2-D or 3-D (batch first) tensors, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[-1] != b.shape[-2]:
        raise InvalidProblem(f"matmul: A is {tuple(a.shape)} and B is {tuple(b.shape)}; A's last size must "
                             f"equal B's second to last (K)")
    batch = {a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1}
    if len(batch) > 1 and 1 not in batch:
        raise InvalidProblem(f"matmul: batch sizes {a.shape[0]} and {b.shape[0]} differ")
    if a.device != b.device:
        raise InvalidProblem(f"matmul: A is on {a.device} but B on {b.device}")
    return max(batch), a.shape[-2], b.shape[-1], a.shape[-1]


def _gemm(a, b, d, activation: str, out_dtype, sig=None) -> torch.Tensor:
    """The cold path: check, build the Problem, dispatch, run; with ``sig`` (a warm-call
    signature of these arguments) also store the closure that repeats this call."""
    batch, m, n, k = _shapes(a, b)
    token = core.dtype_token(a.dtype)
    if core.dtype_token(b.dtype) != token:
        raise InvalidProblem(f"matmul: A is {a.dtype} but B is {b.dtype}; cast one of them")
    t_out = _out_dtype(a, out_dtype)
    out_shape = (batch, m, n) if a.dim() == 3 or b.dim() == 3 else (m, n)
    la, sa, lb, sb, tensors = _operands(a, b, d, batch, m, n, k, t_out, out_shape)
    problem = GemmProblem(m=m, n=n, k=k, batch=batch, dtype=token, dtype_c=core.dtype_token(t_out),
                          layout=la + lb + "r", num_d=len(d), activation=activation)
    disp = core.dispatcher_on("gemm", a, dtypes=(token,), layouts=(problem.layout,),
                              dtypes_c=(problem.dtype_c,), num_ds=(len(d),), d_ops=("add",),
                              activations=(activation,))
    c = core.run(disp, problem, tensors, device=a.device, dtype=t_out).reshape(out_shape)
    if sig is not None:
        f = _warm_closure(disp, problem, tensors, a, b, sa, sb, (batch, m, n, k), t_out, out_shape)
        if getattr(f, "raw", None) is not None and not all(tensors[f"d{i}"].data_ptr() == di.data_ptr()
                                                           for i, di in enumerate(d)):
            f.raw = None   # a D operand is a copy: the raw launch may not take the caller's tensor
        warm.put(sig, f)
    return c


def _d_operand(di, t_out, out_shape, problem_c):
    """A D tensor as the kernels read it: ``di`` broadcast to C's shape, as a view where its rows are
    contiguous (a bias (N,) is a row of stride 0 along M: nothing is materialised, the kernels read D
    through its strides), else a contiguous copy."""
    x = di.to(t_out).expand(out_shape).reshape(problem_c)
    return x if x.stride(-1) == 1 else x.contiguous()


def _operands(a, b, d, batch, m, n, k, t_out, out_shape) -> tuple:
    """(layout of A, A's storage, layout of B, B's storage, the Dispatcher's tensors)."""
    if batch > 1:   # a broadcast operand is repeated: the kernels take one batch stride per operand
        a, b = a.expand(batch, m, k), b.expand(batch, k, n)
    else:
        a, b = a.reshape(m, k), b.reshape(k, n)
    la, sa = _operand(a)
    lb, sb = _operand(b)
    tensors = {"a": sa, "b": sb}
    problem_c = (batch, m, n) if batch > 1 else (m, n)
    for i, di in enumerate(d):
        try:
            tensors[f"d{i}"] = _d_operand(di, t_out, out_shape, problem_c)
        except RuntimeError:
            raise InvalidProblem(f"matmul: d[{i}] of shape {tuple(di.shape)} does not broadcast to the "
                                 f"output shape {out_shape}") from None
    return la, sa, lb, sb, tensors


def _warm_closure(disp, problem, tensors, a, b, sa, sb, sizes, t_out, out_shape):
    """``f(a, b, d) -> C`` repeating a call with this signature.

    Where the Dispatcher's tensors are A and B themselves (views: same data pointer;
    the signature pins their strides) the launcher's recorded replay takes them as they
    are; otherwise (copies, D tensors, the numpy backend) the operands are prepared again
    and the cached Problem runs on the cached Dispatcher."""
    dev = a.device
    if sa.data_ptr() == a.data_ptr() and sb.data_ptr() == b.data_ptr():
        fast = disp.warm(problem, tensors, out_shape=out_shape)
        if fast is not None and len(tensors) == 2:
            fast.raw = fast   # (the recorded launch: what linear's closures call, see with_d.raw)
            return fast   # takes (a, b, d) and ignores d (there is none in such a signature)
        if fast is not None:   # the D tensors prepared as _operands does, then the recorded launch
            batch, m, n, _ = sizes
            problem_c = (batch, m, n) if batch > 1 else (m, n)

            def with_d(a, b, d):
                return fast(a, b, [_d_operand(di, t_out, out_shape, problem_c) for di in d])

            # the recorded launch itself, taking D as the caller's tensors (their data pointers: the
            # launch's strides are the recorded ones), where _operands passed views of them (see _gemm)
            with_d.raw = fast
            return with_d

    def again(a, b, d):
        ts = _operands(a, b, d, *sizes, t_out, out_shape)[4]
        return core.run(disp, problem, ts, device=dev, dtype=t_out).reshape(out_shape)

    return again


@torch.library.custom_op("ck::gemm", mutates_args=())
def gemm_op(a: torch.Tensor, b: torch.Tensor, d: list[torch.Tensor], activation: str,
            out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    """``activation(a @ b + sum(d))`` through the Dispatcher (the custom op ``ck::gemm``)."""
    return _gemm(a, b, d, activation, out_dtype)


@gemm_op.register_fake
def _(a, b, d, activation, out_dtype):
    batch, m, n, _ = _shapes(a, b)
    return a.new_empty((batch, m, n) if a.dim() == 3 or b.dim() == 3 else (m, n),
                       dtype=_out_dtype(a, out_dtype))


def _act_grad(activation: str, z: torch.Tensor) -> torch.Tensor:
    """d activation / dz at the pre-activation ``z``."""
    if activation == "relu":
        return (z > 0).to(z.dtype)
    if activation == "sigmoid":
        s = torch.sigmoid(z)
        return s * (1 - s)
    if activation == "tanh":
        return 1 - torch.tanh(z) ** 2
    if activation == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    if activation == "gelu":
        return 0.5 * (1 + torch.erf(z / math.sqrt(2.0))) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return torch.ones_like(z)


def _sum_to(g: torch.Tensor, shape) -> torch.Tensor:
    """Undo broadcasting: sum ``g`` down to ``shape``."""
    shape = tuple(shape)
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, s in enumerate(shape):
        if s == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


def _setup(ctx, inputs, output):
    a, b, d, activation, _ = inputs
    ctx.save_for_backward(a, b, *d)
    ctx.activation = activation


def _backward(ctx, grad):
    a, b, *d = ctx.saved_tensors
    gz = grad
    if ctx.activation != "none":
        z = gemm_op(a, b, d, "none", grad.dtype)
        gz = grad * _act_grad(ctx.activation, z)
    need_a, need_b, need_d = ctx.needs_input_grad[:3]
    ga = gb = None
    if need_a:
        ga = _sum_to(gemm_op(gz.to(b.dtype), b.transpose(-1, -2), [], "none", a.dtype), a.shape)
    if need_b:
        gb = _sum_to(gemm_op(a.transpose(-1, -2), gz.to(a.dtype), [], "none", b.dtype), b.shape)
    gd = [_sum_to(gz, di.shape).to(di.dtype) for di in d]   # a list, like the input (even empty)
    return ga, gb, gd, None, None


gemm_op.register_autograd(_backward, setup_context=_setup)


def _closure(a, b, d, activation: str, out_dtype) -> tuple:
    """(warm closure ``f(a, b, d) -> C`` for tensors like these, C of this call or None): the cache's
    closure, or the cold path's (which computes C and stores the closure)."""
    sig = (_MATMUL, get_manager(), tensor_sig(a), tensor_sig(b), activation, out_dtype, *[tensor_sig(x) for x in d])
    f = _warm_get(sig)
    if f is not None:
        return f, None
    c = _gemm(a, b, list(d), activation, out_dtype, sig)
    return warm.get(sig), c


def _make_bwd(a, b, d, activation: str, grad, need_a: bool, need_b: bool) -> tuple:
    """(closure ``f(a, b, d, grad) -> (ga, gb, gd)`` for gradients like ``grad``, this call's result).

    The closure holds the warm closures of the backward's GEMMs (dA = dZ B^T, dB = A^T dZ and, under an
    activation, the pre-activation Z): later backward steps of this signature launch them directly."""
    fz = None
    if activation != "none":
        fz, z = _closure(a, b, d, "none", grad.dtype)
        z = fz(a, b, d) if z is None else z
        gz = grad * _act_grad(activation, z)
    else:
        gz = grad
    ga = gb = fa = fb = None
    cast_a, cast_b = gz.dtype != a.dtype, gz.dtype != b.dtype
    if need_a:
        g = gz.to(b.dtype) if cast_b else gz
        fa, ga = _closure(g, b.transpose(-1, -2), (), "none", a.dtype)
        ga = fa(g, b.transpose(-1, -2), ()) if ga is None else ga
    if need_b:
        g = gz.to(a.dtype) if cast_a else gz
        fb, gb = _closure(a.transpose(-1, -2), g, (), "none", b.dtype)
        gb = fb(a.transpose(-1, -2), g, ()) if gb is None else gb
    sum_a = ga is not None and ga.shape != a.shape
    sum_b = gb is not None and gb.shape != b.shape
    if sum_a:
        ga = _sum_to(ga, a.shape)
    if sum_b:
        gb = _sum_to(gb, b.shape)
    gd = [_sum_to(gz, di.shape).to(di.dtype) for di in d]
    if fz is None and not d and not sum_a and not sum_b and not cast_a and not cast_b:
        # the common step: two launches, nothing else
        ra, rb = getattr(fa, "raw", None), getattr(fb, "raw", None)
        if ra is not None and rb is not None:
            # the recorded launches take A and B themselves for their transposed views (same data
            # pointers; the signature pinned the strides the launches were recorded with)
            def bwd(a, b, d, grad):
                return ra(grad, b, ()), rb(a, grad, ()), ()
        elif fa is not None and fb is not None:
            def bwd(a, b, d, grad):
                return fa(grad, b.transpose(-1, -2), ()), fb(a.transpose(-1, -2), grad, ()), ()
        elif fa is not None:
            def bwd(a, b, d, grad):
                return fa(grad, b.transpose(-1, -2), ()), None, ()
        else:
            def bwd(a, b, d, grad):
                return None, None if fb is None else fb(a.transpose(-1, -2), grad, ()), ()
        return bwd, (ga, gb, gd)
    act_grad = _act_grad

    def bwd(a, b, d, grad):
        gz = grad * act_grad(activation, fz(a, b, d)) if fz is not None else grad
        ga = gb = None
        if fa is not None:
            ga = fa(gz.to(b.dtype) if cast_b else gz, b.transpose(-1, -2), ())
            ga = _sum_to(ga, a.shape) if sum_a else ga
        if fb is not None:
            gb = fb(a.transpose(-1, -2), gz.to(a.dtype) if cast_a else gz, ())
            gb = _sum_to(gb, b.shape) if sum_b else gb
        return ga, gb, [_sum_to(gz, di.shape).to(di.dtype) for di in d]
    return bwd, (ga, gb, gd)


class _Eager(torch.autograd.Function):
    """matmul with autograd in eager mode, without the custom-op layer: the forward is the warm
    closure of its signature's :class:`ck_core.warm.Entry`, which the context keeps; the backward
    looks its closure up in that Entry by the gradient's signature (built on the first backward
    step of a signature, see :func:`_make_bwd`).  ``torch.compile`` traces the custom op instead."""

    @staticmethod
    def forward(ctx, entry, a, b, activation, out_dtype, *d):
        ctx.save_for_backward(a, b, *d)
        ctx.entry, ctx.activation = entry, activation
        f = entry.fwd
        if f is not None:
            return f(a, b, d)   # grad mode is off here
        entry.fwd, c = _closure(a, b, d, activation, out_dtype)
        return entry.fwd(a, b, d) if c is None else c

    @staticmethod
    def backward(ctx, grad):
        need = ctx.needs_input_grad
        a, b, *d = ctx.saved_tensors
        if torch.is_grad_enabled():   # a graph of the backward (create_graph): the custom ops record it
            view = SimpleNamespace(saved_tensors=(a, b, *d), activation=ctx.activation,
                                   needs_input_grad=(need[1], need[2], any(need[5:])))
            ga, gb, gd, _, _ = _backward(view, grad)
            return (None, ga, gb, None, None, *gd)
        key = (grad.shape, grad.stride(), grad.dtype, grad.data_ptr() % 16, need[1], need[2])
        bwds = ctx.entry.bwd
        f = bwds.get(key)
        if f is None:
            if len(bwds) > 64:
                bwds.clear()
            f, (ga, gb, gd) = _make_bwd(a, b, d, ctx.activation, grad, need[1], need[2])
            bwds[key] = f
        else:
            ga, gb, gd = f(a, b, d, grad)
        return (None, ga, gb, None, None, *gd)


_matmul_apply = warm.autograd_apply(_Eager, 1, 2)   # (entry, a, b, activation, out_dtype) without D tensors

#: the first field of matmul's warm-call signatures (with D tensors: tensor_sig per tensor;
#: without: the same fields of A and B, flat)
_MATMUL = "ck_gemm.matmul"
_MATMUL2 = "ck_gemm.matmul/ab"
_ENTRY = "ck_gemm.matmul/autograd"
_compiling, _grad_enabled, _warm_get = torch.compiler.is_compiling, torch.is_grad_enabled, warm.get


def _activation(activation) -> str:
    act = "none" if activation is None else activation
    if act not in ACTIVATIONS:
        raise InvalidProblem(f"activation {activation!r} is unknown; use None or one of "
                             f"{', '.join(a for a in ACTIVATIONS if a != 'none')}")
    return act


def matmul(a: torch.Tensor, b: torch.Tensor, *, d: Sequence[torch.Tensor] = (), activation: Optional[str] = None,
           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``activation(a @ b + d[0] + d[1] ...)`` on the Dispatcher's kernel for this problem.

    ``a``: (M, K) or (batch, M, K); ``b``: (K, N) or (batch, K, N) (either may be a
    transposed view: it is passed as a column-major operand); ``d``: tensors that
    broadcast to the output, added before ``activation`` (relu, gelu, silu,
    sigmoid, tanh); ``out_dtype``: C's dtype (default: CK's for the input dtype).
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise InvalidProblem(f"matmul takes torch tensors a and b, got {type(a).__name__} and {type(b).__name__} "
                             "(convert numpy arrays with torch.from_numpy)")
    if not d:
        if not _compiling() and not (_grad_enabled() and (a.requires_grad or b.requires_grad)):
            # the warm path of the common call: a flat signature (tensor_sig's fields of A and B)
            sig = (_MATMUL2, get_manager(), a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % 16,
                   b.shape, b.stride(), b.dtype, b.device, b.data_ptr() % 16, activation, out_dtype)
            f = _warm_get(sig)
            if f is not None:
                return f(a, b, ())
            return _gemm(a, b, [], _activation(activation), out_dtype, sig)
        d = ()
    else:
        d = list(d)
        bad = [type(x).__name__ for x in d if not isinstance(x, torch.Tensor)]
        if bad:
            raise InvalidProblem(f"matmul's d holds {', '.join(bad)}; give torch tensors that broadcast to the "
                                 "output (e.g. a bias of shape (N,))")
    if not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and (
            a.requires_grad or b.requires_grad or any(x.requires_grad for x in d))):
        # no autograd record to keep: skip the op wrapper; a known signature skips the rest
        sig = (_MATMUL, get_manager(), tensor_sig(a), tensor_sig(b), activation, out_dtype,
               *[tensor_sig(x) for x in d])
        f = warm.get(sig)
        if f is not None:
            return f(a, b, d)
        return _gemm(a, b, list(d), _activation(activation), out_dtype, sig)
    if not torch.compiler.is_compiling():
        # one Entry per signature: the forward's closure and the backward's (kept by the autograd context)
        act = _activation(activation)
        sig = (_ENTRY, get_manager(), tensor_sig(a), tensor_sig(b), act, out_dtype, *[tensor_sig(x) for x in d])
        entry = _warm_get(sig)
        if entry is None:
            entry = warm.Entry()
            warm.put(sig, entry)
        return _matmul_apply(entry, a, b, act, out_dtype) if not d else _Eager.apply(entry, a, b, act, out_dtype, *d)
    return gemm_op(a, b, list(d), _activation(activation), out_dtype)


#: the first fields of linear's warm-call signatures (no autograd record / the autograd Entry)
_LINEAR, _LINEAR_ENTRY = "ck_gemm.linear", "ck_gemm.linear/autograd"


def _linear_sig(tag, x, weight, bias) -> tuple:
    return (tag, get_manager(), x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16, weight.shape,
            weight.stride(), weight.dtype, weight.device, weight.data_ptr() % 16,
            None if bias is None else tensor_sig(bias))


def _linear_closure(x, weight, bias) -> tuple:
    """(closure ``f(x, weight, bias) -> y`` for tensors like these, y of this call): matmul's cold path
    on ``x`` as (M, K), ``weight.t()`` and the bias as D; the closure launches matmul's recorded launch
    with the caller's tensors themselves (it reads their data pointers; the signature pins their
    strides, and (M, K) / (K, N) / the bias row are views of them), else repeats the matmul call."""
    n, k = weight.shape
    lead = x.shape[:-1]
    a, bt = x.reshape(-1, k), weight.t()
    d = () if bias is None else (bias,)
    f, y = _closure(a, bt, d, "none", None)
    y = f(a, bt, d) if y is None else y
    raw = getattr(f, "raw", None)
    out = (*lead, n)
    if raw is None or a.data_ptr() != x.data_ptr():
        def again(x, weight, bias):
            return f(x.reshape(-1, k), weight.t(), () if bias is None else (bias,)).reshape(out)
        return again, y.reshape(out)
    if x.dim() == 2:
        if bias is None:
            def g(x, weight, bias):
                return raw(x, weight, ())
        else:
            def g(x, weight, bias):
                return raw(x, weight, (bias,))
    else:
        def g(x, weight, bias):
            return raw(x, weight, () if bias is None else (bias,)).view(out)
    return g, y.reshape(out)


class _LinearEager(torch.autograd.Function):
    """linear with autograd in eager mode on x, weight and bias themselves (no reshape / transpose
    views for autograd to undo): the forward is the signature's closure (:func:`_linear_closure`,
    kept in its :class:`ck_core.warm.Entry`); the backward launches dX = dY W, dW = dY^T X (written
    in the weight's own (out, in) layout, so no layout copy follows) and dbias = the sum of dY's rows,
    through the Entry's closures by the gradient's signature."""

    @staticmethod
    def forward(ctx, entry, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.entry, ctx.bias_dtype = entry, None if bias is None else bias.dtype
        f = entry.fwd
        if f is not None:
            return f(x, weight, bias)
        entry.fwd, y = _linear_closure(x, weight, bias)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        if gy is None:
            return None, None, None, None
        if torch.is_grad_enabled():   # a graph of the backward (create_graph): through matmul's autograd
            n, k = w.shape
            g2 = gy.reshape(-1, n)
            gx = matmul(g2, w).reshape(x.shape) if need[1] else None
            gw = matmul(g2.t(), x.reshape(-1, k)) if need[2] else None
            gb = g2.sum(0).to(ctx.bias_dtype) if need[3] else None
            return None, gx, gw, gb
        key = (grad_sig(gy), need[1], need[2], need[3])
        bwds = ctx.entry.bwd
        f = bwds.get(key)
        if f is None:
            if len(bwds) > 64:
                bwds.clear()
            f, grads = _linear_bwd(x, w, gy, need[1], need[2], need[3], ctx.bias_dtype)
            bwds[key] = f
            return (None, *grads)
        return (None, *f(x, w, gy))


_linear_apply = warm.autograd_apply(_LinearEager, 1, 3)   # (entry, x, weight, bias)


def _linear_bwd(x, w, gy, need_x: bool, need_w: bool, need_b: bool, bias_dtype) -> tuple:
    """(closure ``f(x, weight, dy) -> (dx, dweight, dbias)``, this call's gradients)."""
    n, k = w.shape
    g2 = gy.reshape(-1, n)
    x2 = x.reshape(-1, k)
    fx = fw = None
    gx = gw = gb = None
    if need_x:   # dX (M, K) = dY (M, N) @ W (N, K)
        fx, gx = _closure(g2, w, (), "none", x.dtype)
        gx = (fx(g2, w, ()) if gx is None else gx).reshape(x.shape)
    if need_w:   # dW (N, K) = dY^T (N, M) @ X (M, K): the weight's layout
        fw, gw = _closure(g2.t(), x2, (), "none", w.dtype)
        gw = fw(g2.t(), x2, ()) if gw is None else gw
    cast = bias_dtype is not None and bias_dtype != gy.dtype
    if need_b:
        gb = g2.sum(0)
        gb = gb.to(bias_dtype) if cast else gb
    xshape, flat = x.shape, x.dim() == 2 and gy.dim() == 2

    def bwd(x, w, gy):
        g2 = gy if flat else gy.reshape(-1, n)
        gx = gw = None
        if fx is not None:
            gx = fx(g2, w, ()) if flat else fx(g2, w, ()).reshape(xshape)
        if fw is not None:
            gw = fw(g2.t(), x if flat else x.reshape(-1, k), ())
        gb = None
        if need_b:
            gb = g2.sum(0)
            gb = gb.to(bias_dtype) if cast else gb
        return gx, gw, gb
    return bwd, (gx, gw, gb)


def linear(x: torch.Tensor, weight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ weight.T + bias`` like ``torch.nn.functional.linear`` (weight is (out, in)).

    ``weight`` may be a :class:`PackedWeight` (:func:`preshuffle`): then the Dispatcher selects
    among the pre-shuffled-B keys of the tile it was packed for (inference only: no autograd).
    A known signature (shapes, strides, dtypes, device, alignment of x, weight and bias) launches
    its recorded GEMM on the tensors as they are; under autograd the backward is three launches
    (dX, dW in the weight's layout, the bias's row sum)."""
    if isinstance(weight, PackedWeight):
        return _linear_packed(x, weight, bias)
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)) or (
            bias is not None and not isinstance(bias, torch.Tensor)):
        raise InvalidProblem(f"linear takes torch tensors x, weight (and bias), got {type(x).__name__}, "
                             f"{type(weight).__name__}, {type(bias).__name__}")
    if not _compiling() and (bias is None or bias.dim() == 1):   # (a broadcast bias: matmul's D below)
        grad = _grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad))
        sig = _linear_sig(_LINEAR_ENTRY if grad else _LINEAR, x, weight, bias)
        f = _warm_get(sig)
        if f is not None:
            return _linear_apply(f, x, weight, bias) if grad else f(x, weight, bias)
    else:
        grad = sig = None
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise InvalidProblem(f"linear: x is {tuple(x.shape)} and weight {tuple(weight.shape)}; weight must be "
                             f"(out_features, in_features) with in_features = x's last size")
    if bias is not None and bias.dim() == 1 and bias.shape[0] != weight.shape[0]:
        raise InvalidProblem(f"linear: bias must have shape ({weight.shape[0]},) (out_features), got "
                             f"{tuple(bias.shape)}")
    if sig is None:
        lead = x.shape[:-1]
        y = matmul(x.reshape(-1, x.shape[-1]), weight.t(), d=() if bias is None else (bias,))
        return y.reshape(*lead, weight.shape[0])
    if grad:
        entry = warm.Entry()
        warm.put(sig, entry)
        return _linear_apply(entry, x, weight, bias)
    f, y = _linear_closure(x, weight, bias)
    warm.put(sig, f)
    return y


# -- pre-shuffled weights (CK's preshuffle GEMM) ----------------------------------------------------

#: the M a weight's tile is chosen for when preshuffle() is not told one
PRESHUFFLE_M = 256


class PackedWeight:
    """A linear weight (out_features x in_features) pre-shuffled once in a GEMM kernel's tile order.

    ``data``: ``[ceil(N/tile_n), ceil(K/tile_k), tile_n, tile_k]`` (``ck_gemm.problem.pack_b``),
    ``tile``: ``(tile_n, tile_k)`` it was packed for, ``shape``: the logical ``(N, K)``.
    :func:`linear` takes it in place of the weight."""

    __slots__ = ("data", "tile", "shape", "__weakref__")

    def __init__(self, data: torch.Tensor, tile: tuple, shape: tuple):
        n, k = shape
        tn, tk = tile
        want = (-(-n // tn), -(-k // tk), tn, tk)
        if not isinstance(data, torch.Tensor) or tuple(data.shape) != want or not data.is_contiguous():
            raise InvalidProblem(f"PackedWeight: data must be a contiguous tensor of shape {want} for a {n}x{k} "
                                 f"weight packed for tile {tn}x{tk}; make one with ck_gemm.preshuffle(weight)")
        if data.data_ptr() % 16:   # the kernels assume a 16-byte aligned B
            data = data.clone()
        self.data, self.tile, self.shape = data, (int(tn), int(tk)), (int(n), int(k))

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return self.data.device

    def __repr__(self):
        return (f"PackedWeight(shape={self.shape}, tile={self.tile[0]}x{self.tile[1]}, dtype={self.data.dtype}, "
                f"device={self.data.device})")


def _packed_dispatcher(t, token: str, dtype_c: str, num_d: int):
    return core.dispatcher_on("gemm", t, dtypes=(token,), layouts=("rcr",), dtypes_c=(dtype_c,), num_ds=(num_d,),
                              d_ops=("add",), activations=("none",), variants=("preshuffle",))


def preshuffle(weight: torch.Tensor, *, m: int = PRESHUFFLE_M) -> PackedWeight:
    """``weight`` (out_features x in_features) pre-shuffled once for :func:`linear`.

    The tile is the Dispatcher's: it selects a pre-shuffled-B key for an ``m`` x out x in problem
    on the weight's device (``m``: a typical token count of the calls to come; later calls of any
    M choose among the keys of this tile), and the weight is packed in that key's N x K tile order."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise InvalidProblem(f"preshuffle: weight must be a 2-D tensor (out_features, in_features), got "
                             f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise InvalidProblem(f"preshuffle: m={m!r} must be a positive int (the token count to choose the tile for)")
    token = core.dtype_token(weight.dtype)
    n, k = weight.shape
    problem = GemmProblem(m=m, n=n, k=k, dtype=token, layout="rcr", preshuffle=True)
    key = _packed_dispatcher(weight, token, problem.dtype_c, 0).select(problem)
    tile = (key.algorithm.tile_n, key.algorithm.tile_k)
    return PackedWeight(pack_b(weight.detach(), *tile), tile, (n, k))


_PACKED: dict = {}   # call signature -> (problem, Dispatcher, warm closure or None)
core.on_clear(_PACKED.clear)


def _linear_packed(x, w: PackedWeight, bias):
    n, k = w.shape
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != k:
        raise InvalidProblem(f"linear: x is {tuple(getattr(x, 'shape', ()))} and the packed weight {w.shape}; "
                             f"x's last size must be in_features = {k}")
    if x.dtype != w.dtype or x.device != w.device:
        raise InvalidProblem(f"linear: x is {x.dtype} on {x.device}, the packed weight {w.dtype} on {w.device}; "
                             f"they must agree")
    if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
        raise InvalidProblem("linear: a pre-shuffled weight is for inference; call under torch.no_grad() "
                             "(or train with the plain weight)")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,)):
        raise InvalidProblem(f"linear: bias must be a tensor of shape ({n},), got "
                             f"{tuple(getattr(bias, 'shape', ())) or type(bias).__name__}")
    lead = x.shape[:-1]
    a = x.reshape(-1, k)
    m = a.shape[0]
    if m == 0:
        return x.new_empty((*lead, n))
    if a.stride(-1) != 1 or (m > 1 and a.stride(0) != k) or a.data_ptr() % 16:
        a = _aligned(a.contiguous())
    sig = (get_manager(), a.shape, a.dtype, a.device, w.tile, w.shape,
           None if bias is None else (bias.dtype, bias.device))
    hit = _PACKED.get(sig)
    if hit is not None and hit[2] is not None:
        return hit[2](a, w.data, ()).reshape(*lead, n)
    token = core.dtype_token(a.dtype)
    t_out = _out_dtype(a, None)
    if hit is None:
        problem = GemmProblem(m=m, n=n, k=k, dtype=token, dtype_c=core.dtype_token(t_out), layout="rcr",
                              num_d=0 if bias is None else 1, preshuffle=True, pack_n=w.tile[0], pack_k=w.tile[1])
        hit = (problem, _packed_dispatcher(a, token, problem.dtype_c, problem.num_d), None)
    problem, disp, _ = hit
    tensors = {"a": a, "b": w.data}
    if bias is not None:
        tensors["d0"] = bias.to(t_out).expand(m, n)
    c = core.run(disp, problem, tensors, device=a.device, dtype=t_out)
    if bias is None:   # the launcher's recorded replay, where it offers one (plain GEMMs on a GPU)
        hit = (problem, disp, disp.warm(problem, tensors, out_shape=(m, n)))
    _PACKED[sig] = hit
    return c.reshape(*lead, n)
