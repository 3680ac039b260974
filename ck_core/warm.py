"""Warm calls of the public APIs: one signature -> one ready closure.

A public call's cold path builds its Problem, validates it, asks the Dispatcher
for a plan and launches it; then it stores a closure under a *signature* of its
arguments.  The next call with the same signature computes that signature and
calls the closure: no Problem, no validation, no Dispatcher lookup.

The signature must hold everything the cold path read from the arguments (a wrong
hit is a silently wrong result): for each tensor :func:`tensor_sig` (shape,
strides, dtype, device, data pointer modulo 16: what selection, the Triton
specialisation and the launch arguments depend on), plus the op's flags and the
plugin manager.  Data pointers themselves are not in it: the closures take new
tensors and pass only their data pointers to recorded launches.

The cache is process-wide and bounded; :func:`ck_core.api.clear` empties it with
the Dispatchers (after changing CK_BACKEND, plugins or tuning data).
"""
from __future__ import annotations

#: signature -> closure; cleared whole when it grows past LIMIT (signatures are few in real models)
_CACHE: dict = {}
LIMIT = 4096

get = _CACHE.get


def tensor_sig(t) -> tuple:
    """What a launch may read from a tensor other than its data: shape, strides, dtype,
    device, and the base address's alignment (Triton specialises pointers on 16 bytes)."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)


def contiguous_strides(shape) -> tuple:
    """The strides of a contiguous tensor of ``shape`` (as torch gives them): warm closures
    allocate outputs with ``torch.empty_strided``, which parses its arguments faster than
    ``torch.empty``."""
    out, n = [], 1
    for s in reversed(shape):
        out.append(n)
        n *= max(s, 1)
    return tuple(reversed(out))


class Entry:
    """One autograd-recorded signature's cached work: ``fwd`` (the forward's closure) and ``bwd``, the
    backward's closures by the gradient's signature (:func:`grad_sig` plus what the backward needs).
    The autograd context of a call keeps its Entry, so the backward is a dict lookup and the launches:
    no Problem, no selection, no signature of the saved tensors (the forward's signature pinned them)."""

    __slots__ = ("fwd", "bwd", "extra")

    def __init__(self, fwd=None, extra=None):
        self.fwd, self.bwd, self.extra = fwd, {}, extra


def grad_sig(t) -> tuple:
    """:func:`tensor_sig` of a gradient on a known device (the forward's signature pinned it)."""
    return (t.shape, t.stride(), t.dtype, t.data_ptr() % 16)


def put(sig, fn) -> None:
    if len(_CACHE) >= LIMIT:
        _CACHE.clear()
    _CACHE[sig] = fn


def clear() -> None:
    _CACHE.clear()


def size() -> int:
    """How many signatures have a closure (tests: a new signature must add one)."""
    return len(_CACHE)



def autograd_apply(cls, first: int, count: int):
    """``cls.apply`` (a ``torch.autograd.Function`` without ``setup_context``) for eager calls, without
    ``Function.apply``'s Python layer (about 4 us a call on a desktop CPU): the C++ apply, after
    unwrapping dead functorch wrappers of the tensor arguments ``args[first:first + count]`` (None
    allowed) as ``Function.apply`` does for every tensor argument (the others must be no functorch
    tensors: the callers' flags, tables and Entry objects); under functorch transforms (vmap, grad,
    ...) ``cls.apply`` itself."""
    import torch

    c_apply = super(torch.autograd.Function, cls).apply
    slow = cls.apply
    active = torch._C._are_functorch_transforms_active
    unwrap = torch._C._functorch.unwrap_if_dead
    span = range(first, first + count)

    def apply(*args):
        if active():
            return slow(*args)
        args = list(args)
        for i in span:
            x = args[i]
            if x is not None:
                args[i] = unwrap(x)
        return c_apply(*args)

    return apply
