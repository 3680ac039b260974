"""Warm calls of the FMHA launchers: the Triton launches of one run, recorded and replayed.

The public API (:mod:`ck_fmha.api`) keeps per call signature (:mod:`ck_core.warm`) a closure
that repeats a call without its Python layers (problem, Dispatcher, launcher argument
processing, Triton's binder): the launches one run made, recorded with
:mod:`ck_core.backends.triton_replay`, launched again with the new tensors.

Inside :func:`recording` every launch a launcher makes through its ``via``
(``implement.kernel_via``) is recorded.  :func:`replayer` then matches each tensor argument
by data pointer to the call's named tensors (inputs, and the outputs the run returned),
or to the device error flag; where the caller allows ``scratch``, a tensor a launcher
allocated for itself (an fp32 intermediate: the backward's delta, its dQ accumulator, the
split-KV partials) is allocated again on each replay, zeroed where the launcher allocated it
zeroed (:func:`zeroed`: an accumulator).  Anything else -- a view into a named tensor, a buffer used with two
dtypes -- means no replay: the call stays on the general path.  A torch operation between
launches (a copy that made an input dense, a cast) is not recorded; the backward's caller
checks the replay against the run once before caching it.
"""
from __future__ import annotations

import contextlib
from typing import Optional

_RECORDING: Optional[list] = None


class _Recs(list):
    """The replays of a :func:`recording`, and ``zeroed``: the data pointers of the buffers the
    launchers allocated zeroed (:func:`zeroed`), which a replay zeroes again."""

    __slots__ = ("zeroed", "scratch")


@contextlib.contextmanager
def recording():
    """``with recording() as recs:`` the replays (or None where one could not be recorded)
    of every launch a launcher's ``via`` makes in the block."""
    global _RECORDING
    recs = _Recs()
    recs.zeroed, recs.scratch = set(), set()
    prev, _RECORDING = _RECORDING, recs
    try:
        yield _RECORDING
    finally:
        _RECORDING = prev


def active() -> bool:
    """Whether a :func:`recording` is under way (launchers with launch caches of their own, the
    Gluon forward's, then launch through ``via`` so that the launch is recorded)."""
    return _RECORDING is not None


def zeroed(t) -> None:
    """``t``, a buffer a launcher allocated, starts zeroed (an accumulator): a replay of the
    running :func:`recording` allocates it zeroed too (the others as ``torch.empty``)."""
    if _RECORDING is not None:
        _RECORDING.zeroed.add(t.data_ptr())


def scratch(t) -> None:
    """``t``, a buffer a launcher allocated (any dtype: the int32 offsets and flags of
    :mod:`ck_fmha.backends.triton.guards`), is written whole by a recorded launch before anything reads
    it: a replay of the running :func:`recording` allocates it again (``torch.empty``)."""
    if _RECORDING is not None:
        _RECORDING.scratch.add(t.data_ptr())


def wrap(fn, grid, launch):
    """``launch`` (a bound launch of ``fn`` returning its CompiledKernel), recorded while
    :func:`recording` is active."""
    recs = _RECORDING
    if recs is None:
        return launch
    from ck_core.backends import triton_replay

    def recorded(*args, **kwargs):
        r = triton_replay.record(fn, grid, args, kwargs, via=lambda f, g: launch)
        recs.append(r)
        return getattr(r, "kernel", None)

    return recorded


def replayer(inputs: dict, outputs: dict, recs: list, scratch: bool = False, zero: bool = True):
    """``f(*inputs) -> {name: output}`` launching ``recs`` again with new input tensors (in the
    order of ``inputs``) and fresh outputs (shapes, strides and dtypes as recorded), or None.
    Scratch buffers start zeroed where the launcher said so (:func:`zeroed`, recorded in ``recs``),
    else where ``zero`` (``recs`` from elsewhere than :func:`recording`)."""
    import torch

    from ...device_errors import flag

    if not recs or any(r is None for r in recs):
        return None
    named = list(inputs.values()) + list(outputs.values())
    dev = named[0].device
    ptrs = {t.data_ptr(): i for i, t in enumerate(named)}
    if len(ptrs) != len(named):
        return None   # named tensors share memory: a later call's need not
    storages = {t.untyped_storage().data_ptr() for t in named}
    flag_ptr = flag(dev).data_ptr()
    zero_ptrs = getattr(recs, "zeroed", None)
    declared = getattr(recs, "scratch", ())
    buffers: dict = {}   # data pointer -> (position, dtype)
    specs: list = []     # (shape, stride, dtype, zeroed) per buffer
    plan = []
    for r in recs:
        template, slots = list(r.args), []
        for i, a in enumerate(template):
            if not isinstance(a, torch.Tensor):
                continue
            p = a.data_ptr()
            which = ptrs.get(p)
            if which is None:
                if p == flag_ptr:
                    continue
                hit = buffers.get(p)
                if hit is None:
                    st = a.untyped_storage()
                    # fp32 only: the kernels' intermediates (delta, accumulators, split partials);
                    # anything else is likely a torch operation's result (a copy, clamped offsets)
                    # that a replay would not recompute
                    if not scratch or st.data_ptr() in storages or a.storage_offset() \
                            or st.nbytes() != a.numel() * a.element_size() or (
                                a.dtype != torch.float32 and p not in declared):
                        return None
                    hit = buffers[p] = (len(named) + len(specs), a.dtype)
                    specs.append((tuple(a.shape), a.stride(), a.dtype, p in zero_ptrs if zero_ptrs is not None
                                  else zero))
                if hit[1] != a.dtype:
                    return None
                which = hit[0]
            slots.append((i, which))
            template[i] = r.args[i] = None   # (no reference to the recorded tensors)
        plan.append((r, template, tuple(slots)))
    n_in, names = len(inputs), list(outputs)
    fresh = [(tuple(t.shape), t.stride(), t.dtype, False) for t in outputs.values()] + specs
    empty, zeros = torch.empty_strided, torch.zeros

    def replay(*ins):
        vals = list(ins)
        for shape, stride, dtype, zero in fresh:
            vals.append(zeros(shape, dtype=dtype, device=dev).as_strided(shape, stride) if zero
                        else empty(shape, stride, dtype=dtype, device=dev))
        for r, template, slots in plan:
            args = template.copy()
            for i, which in slots:
                args[i] = vals[which]
            r(args)
        return dict(zip(names, vals[n_in:n_in + len(names)]))

    return replay


def verified(f, inputs: dict, want: dict):
    """``f`` (a :func:`replayer`) where replaying ``inputs`` reproduces the run's outputs ``want``
    (relative error < 1e-2 each: a torch operation between launches, which a replay would not repeat,
    shows here), else None.  A host synchronisation: callers run it once per signature, never while a
    CUDA graph is being captured."""
    got = f(*inputs.values())
    for name, w in want.items():
        w = w.float()
        err = (got[name].float() - w).norm() / w.norm().clamp_min(1e-30)
        if not float(err) < 1e-2:
            return None
    return f
