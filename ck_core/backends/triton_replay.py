"""Replay a recorded Triton launch with new tensors, skipping ``JITFunction.run``.

``kernel[grid](*args)`` re-binds every argument, recomputes the specialisation key and
looks the compiled kernel up on each call: about 20 us of Python on an H100 host.  A
dispatcher launcher sees the same problem over and over, so it can record the first
launch (the compiled kernel, the grid and every argument) and afterwards hand the
compiled kernel's own launcher the new tensors directly.

Host tensor descriptors (TMA) are the other cost: Triton's launcher turns each
``TensorDescriptor`` into a ``CUtensorMap`` on every call.  A descriptor depends only on
the base address, shape, strides and block shape; within one recording all but the
address are fixed, so :class:`Replay` keeps the expanded descriptor per base address.

Everything here is an optimisation with a safe way out: :func:`record` returns ``None``
where a replay cannot be set up (the interpreter, a Triton whose internals differ),
and callers keep using the ordinary launch then; while a launch hook is installed (a
profiler such as proton) each replay goes through Triton's own launch path so the hook
sees it.  Written against triton 3.6 (the pinned version).
"""
from __future__ import annotations

import inspect
import logging
from collections import OrderedDict
from typing import Optional, Sequence

log = logging.getLogger(__name__)

try:  # the replay only runs where triton is installed; the module imports without it
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover
    _knobs = None

#: how many base addresses per descriptor slot keep their expanded CUtensorMap
DESC_CACHE_SIZE = 64


def _tensordesc_pieces(run):
    """(raw launcher, positions, metadata) behind Triton's tensor-descriptor wrapper, or None."""
    launch = getattr(run, "launch", None)
    code = getattr(launch, "__code__", None)
    if code is None or launch.__closure__ is None:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__)))
    try:
        return cells["launcher"], frozenset(cells["tensordesc_indices"]), list(cells["tensordesc_meta"])
    except KeyError:
        return None


class Replay:
    """One recorded launch: ``replay(args)`` launches it again with ``args``.

    ``args`` is the full argument list in the kernel's parameter order (constexprs
    included, as recorded; see :attr:`args` and :meth:`slot`).  Tensor slots take any
    tensor with the recorded dtype, shape, strides and alignment (the caller's cache key
    must guarantee that); descriptor slots (:attr:`desc_slots`) take the *base tensor*
    of the descriptor, not a descriptor.

    ``args`` holds the recorded call's tensors, and nothing else here does: a caller that
    keeps the replay sets the slots it fills per call to None (``args[i] = None``, or
    :meth:`release`) once it has matched them, so that no cache keeps a tensor of that call
    alive (a CUDA graph's pool must hold nothing but the graph's tensors:
    ``torch.compile(mode="reduce-overhead")``).  Slots left holding tensors must hold buffers
    kept for good (:func:`ck_core.memory.persistent`).
    """

    __slots__ = ("args", "names", "grid", "device", "_kernel", "_run", "_raw", "_descs",
                 "_desc_cache", "_coop", "_pdl", "_stream", "_direct")

    def __init__(self, kernel, names, args, grid, device, descs, raw):
        import torch

        self.names = tuple(names)
        self.args = list(args)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.device = device
        self._kernel = kernel
        self._run = kernel.run
        self._raw = raw              # (launcher, meta per desc position) or None
        # {position: template TensorDescriptor} without its base: the recorded tensors live in ``args``
        # alone, which the caller empties (see the class's note)
        self._descs = {i: _with_base(d, None) for i, d in descs.items()}
        self._desc_cache = {i: OrderedDict() for i in descs}
        self._coop = getattr(kernel.run, "launch_cooperative_grid", False)
        self._pdl = getattr(kernel.run, "launch_pdl", False)
        self._stream = torch._C._cuda_getCurrentRawStream
        # no descriptors, no scratch memory: the compiled launcher itself (NVIDIA's CudaLauncher.__call__
        # only allocates scratch memory, none here, and passes the same arguments on; AMD's orders them
        # otherwise and keeps its own call)
        self._direct = None
        run = kernel.run
        if not descs and type(run).__name__ == "CudaLauncher" and not getattr(run, "global_scratch_size", 1) \
                and not getattr(run, "profile_scratch_size", 1):
            self._direct = getattr(run, "launch", None)
        for i in descs:               # descriptor slots hold their base tensor
            self.args[i] = descs[i].base

    def release(self, slots=None) -> None:
        """Drop the recorded tensors from :attr:`args` (``slots``: those positions; default every
        tensor): a caller that keeps this replay passes its own tensors in those slots anyway."""
        import torch

        for i in (range(len(self.args)) if slots is None else slots):
            if slots is not None or isinstance(self.args[i], torch.Tensor):
                self.args[i] = None

    @property
    def kernel(self):
        """The CompiledKernel this replays."""
        return self._kernel

    @property
    def desc_slots(self) -> tuple:
        return tuple(sorted(self._descs))

    def slot(self, name: str) -> int:
        return self.names.index(name)

    def _expand(self, i, base):
        meta = self._raw[1][i]
        if meta is None:   # a descriptor the compiler decomposed: its expansion is the base tensor itself and
            # its shape and strides (no CUtensorMap to save; caching it would keep this call's tensor alive)
            return _tensordesc_arg(_with_base(self._descs[i], base), None)
        cache = self._desc_cache[i]
        key = base.data_ptr()
        hit = cache.get(key)
        if hit is None:
            d = _with_base(self._descs[i], base)
            hit = _tensordesc_arg(d, meta)
            cache[key] = hit
            if len(cache) > DESC_CACHE_SIZE:
                cache.popitem(last=False)
        return hit

    def __call__(self, args: Sequence) -> None:
        k = self._kernel
        rt = _knobs.runtime
        # a launch hook does something (triton 3.6 keeps an empty HookChain): checked inline, per launch
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        if (enter is not None and getattr(enter, "calls", True)) or (
                leave is not None and getattr(leave, "calls", True)):
            self._hooked_launch(args)   # a profiler listens: Triton's own path calls its hooks
            return
        g0, g1, g2 = self.grid
        stream = self._stream(self.device)
        direct = self._direct
        if direct is not None:
            direct(g0, g1, g2, stream, k.function, self._coop, self._pdl, None, None, k.packed_metadata, None, None,
                   None, *args)
            return
        if not self._descs:
            self._run(g0, g1, g2, stream, k.function, k.packed_metadata, None, None, None, *args)
            return
        if self._raw is None:         # descriptors through Triton's own wrapper
            full = list(args)
            for i in self._descs:
                full[i] = _with_base(self._descs[i], args[i])
            self._run(g0, g1, g2, stream, k.function, k.packed_metadata, None, None, None, *full)
            return
        final = []
        for i, a in enumerate(args):
            if i in self._descs:
                final.extend(self._expand(i, a))
            else:
                final.append(a)
        self._raw[0](g0, g1, g2, stream, k.function, self._coop, self._pdl, None, None,
                     k.packed_metadata, None, None, None, *final)


    def _hooked_launch(self, args):
        full = list(args)
        for i in self._descs:
            full[i] = _with_base(self._descs[i], args[i])
        self._kernel[self.grid](*full)


_MAKE_DESC = []


def _tensordesc_arg(desc, meta) -> list:
    """Triton's launcher arguments of a host tensor descriptor (``make_tensordesc_arg``, imported once)."""
    if not _MAKE_DESC:
        from triton.backends.nvidia.driver import make_tensordesc_arg

        _MAKE_DESC.append(make_tensordesc_arg)
    return _MAKE_DESC[0](desc, meta)


def _with_base(template, base):
    """A copy of a TensorDescriptor with another base tensor (same shape and strides)."""
    d = object.__new__(type(template))
    d.__dict__.update(template.__dict__)
    d.base = base
    return d


def record(fn, grid, args: Sequence, kwargs: dict, name: Optional[str] = None,
           extra: Optional[dict] = None, via=None) -> Optional[Replay]:
    """Launch ``fn[grid](*args, **kwargs)`` once; return a :class:`Replay` of it, or None.

    ``name``: the kernel key's name; the launch then takes its kernel from the kernel
    cache (:func:`ck_core.backends.triton_artifacts.launch`), so what is replayed is
    the artifact ``ck build`` wrote (``extra``: the key's compile options).  ``via``: instead of
    ``name``, a launcher's ``via(fn, grid)`` (a bound launch that returns the CompiledKernel; one
    that records the call for ``ck build`` returns None, and so does this).  None means "keep calling ``fn[grid]``":
    interpreter functions, or a Triton whose internals differ from the ones this was
    written against.
    """
    if via is not None:
        kernel = via(fn, grid)(*args, **kwargs)
    elif name is None:
        kernel = fn[grid](*args, **kwargs)
    else:
        from . import triton_artifacts

        kernel = triton_artifacts.launch(name, fn, grid, args, kwargs, extra=extra)
    try:
        return _replay_of(fn, kernel, grid, args, kwargs)
    except Exception as e:  # noqa: BLE001 - any surprise means: no replay, plain launches
        log.debug("no replay for %s: %s: %s", getattr(fn, "__name__", fn), type(e).__name__, e)
        return None


def _replay_of(fn, kernel, grid, args, kwargs):
    from triton.tools.tensor_descriptor import TensorDescriptor

    if kernel is None or not hasattr(kernel, "packed_metadata") or not hasattr(kernel, "run"):
        log.debug("no replay for %s: %r is not a compiled kernel", getattr(fn, "__name__", fn), kernel)
        return None
    run = kernel.run
    # scratch memory per launch: Triton's launcher allocates it; the raw path below cannot
    scratch = getattr(run, "global_scratch_size", 0) or getattr(run, "profile_scratch_size", 0)
    names = list(fn.arg_names)
    defaults = {p.name: p.default for p in getattr(fn, "params", ())}
    values = list(args)
    for name in names[len(values):]:
        if name in kwargs:
            values.append(kwargs[name])
        elif defaults.get(name, inspect.Parameter.empty) is not inspect.Parameter.empty:
            values.append(defaults[name])
        else:
            log.debug("no replay for %s: no value for %s", getattr(fn, "__name__", fn), name)
            return None
    kinds = (TensorDescriptor, )
    try:  # Gluon kernels take Gluon's host descriptors (same base/shape/strides/padding fields)
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
        kinds += (GluonDescriptor, )
    except ImportError:  # pragma: no cover - a triton without Gluon
        pass
    descs = {i: v for i, v in enumerate(values) if isinstance(v, kinds)}
    raw = None
    if descs and not scratch:
        pieces = _tensordesc_pieces(run)
        if pieces is not None:
            launcher, positions, meta = pieces
            if set(descs) == set(positions):
                order = sorted(positions)
                raw = (launcher, {i: meta[n] for n, i in enumerate(order)})
    import torch

    device = torch.cuda.current_device()
    return Replay(kernel, names, values, grid, device, descs, raw)


def replayable(t) -> bool:
    """Whether launches on ``t``'s device can be recorded and replayed: CUDA tensors (the
    seam a CPU benchmark with stubbed launches replaces)."""
    return t.is_cuda
