"""Bridge between GEMM kernel keys and the Triton templates in ``ck_gemm.backends.triton``.

* :func:`config_of` maps a key's algorithm onto a Triton ``GemmConfig``;
* :func:`render` gives the triton backend something to AOT-compile;
* :func:`make_launcher` gives the dispatcher a callable for a key: it caches
  the config and launches the template directly (no re-selection per call).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect

import attrs
import logging

from ck_core.errors import InvalidProblem, UnsupportedProblem

from .configs import config_of_algorithm

log = logging.getLogger(__name__)

def config_of(key):
    return config_of_algorithm(key.algorithm)


@functools.lru_cache(maxsize=None)
def _template_hash() -> str:
    from . import aot, kernels

    src = inspect.getsource(kernels) + inspect.getsource(aot)
    return hashlib.sha256(src.encode()).hexdigest()


@attrs.frozen
class TritonRendered:
    spec: object
    source_hash: str
    options: dict
    key: object = attrs.field(default=None, eq=False)

    def jit_calls(self, problem=None) -> list:
        """A representative launch of the key's kernels (or their launch on ``problem``),
        ``[(suffix, fn, args, kwargs)]``: what ``ck build`` compiles into the entries the
        launcher loads."""
        return jit_calls(self.key, problem)

    def compile(self, target, extra_options=None):
        spec = self.spec
        if extra_options:
            spec = dataclasses.replace(spec, options={**spec.options, **extra_options})
        return spec.compile(target)


def _spec(key):
    from ck_core.plugins import get_manager

    from .aot import kernel_for

    s = key.signature
    return kernel_for(config_of(key), dtype=s.dtype, layout=s.layout, out_dtype=s.dtype_c,
                      num_d=s.num_d, d_op=s.d_op, activation=s.activation,
                      num_sms=get_manager().arch(key.arch).compute_units, preshuffle=s.preshuffle)


def render(key, backend: str):
    if backend == "triton":
        spec = _spec(key)
        h = hashlib.sha256((_template_hash() + repr(sorted(spec.constexprs.items()))
                            + repr(spec.signature) + repr(spec.options)).encode()).hexdigest()
        return TritonRendered(spec, h, dict(spec.options), key)
    if backend == "ck":
        from ..ck.template import render_ck

        return render_ck(key)
    raise UnsupportedProblem(f"gemm has no {backend} templates")


def jit_calls(key, problem=None) -> list:
    """The launches of ``key`` on ``problem``'s operands (contiguous, 16-byte aligned, as the
    public API passes them), or by default on the problems whose kernels every problem of the
    common case loads: sizes are run-time integers and M, N, K only their alignment class
    (kernels.py: what the kernels specialise on), so the representatives are M a multiple of 16
    or odd (token counts are any number) times K a multiple of the K tile or not (EVEN_K, the one
    size-derived constexpr), N and K multiples of 16 and no batch.  Tensors are on torch's meta
    device (nothing runs), so this compiles on a machine without a GPU."""
    import torch

    from ck_core.plugins import get_manager

    from . import launch as L
    from .aot import parse_layout

    cfg, s = config_of(key), key.signature
    a_r, b_r, c_r = parse_layout(s.layout)
    if problem is None:
        base = 2 * max(cfg.block_m, cfg.block_n, cfg.block_k, 16)
        ks = (base, base + 16) if cfg.block_k > 16 else (base,)   # base + 16: not a whole K tile
        shapes = [(m, base, k, ()) for m in (base, base + 1) for k in ks]
    else:
        shapes = [(problem.m, problem.n, problem.k, (problem.batch,) if problem.batch > 1 else ())]
    t_in, t_out = torch_dtype(s.dtype), torch_dtype(s.dtype_c)
    calls = []

    def capture(spec, vals, M, N, batch, name):
        fn, args, kwargs = L.call_of(spec, vals)
        calls.append((name[len(key.name):], fn, args, kwargs))

    for m, n, k, lead in shapes:
        a = torch.empty(lead + ((m, k) if a_r else (k, m)), dtype=t_in, device="meta")
        b = torch.empty(lead + ((k, n) if b_r else (n, k)), dtype=t_in, device="meta")
        if s.preshuffle:   # B pre-shuffled for the key's tile
            b = torch.empty((-(-n // cfg.block_n), -(-k // cfg.block_k), cfg.block_n, cfg.block_k), dtype=t_in,
                            device="meta")
        ds = tuple(torch.empty((m, n) if c_r else (n, m), dtype=t_out, device="meta") for _ in range(s.num_d))
        try:
            L.gemm(a, b, layout=s.layout, config=cfg, d_tensors=ds, d_op=s.d_op,
                   activation=None if s.activation == "none" else s.activation, out_dtype=t_out,
                   num_sms=get_manager().arch(key.arch).compute_units, kernel_name=key.name, launch=capture,
                   packed_n=n if s.preshuffle else None)
        except UnsupportedProblem:   # a TMA key: an odd M in a column-major operand has no descriptor
            if problem is not None or (m, k) == (shapes[0][0], shapes[0][2]):
                raise
    return calls


from ck_core.dtypes import torch_dtype  # noqa: E402,F401  (one copy, in the core)


def make_launcher(key, num_sms=None):
    """A callable ``(problem, tensors) -> {"c": tensor}`` bound to this key's config.

    ``num_sms``: the programs of a persistent grid (the arch's compute units);
    None reads the device's."""
    from ck_core.backends import triton_artifacts

    from . import launch as L
    from .launch import gemm

    cfg = config_of(key)
    extra = triton_artifacts.compile_options(key)
    # the key's compile options are part of its cache entry (as ck build writes it)
    via = (lambda spec, vals, M, N, batch, name: L._launch(spec, vals, M, N, batch, name, extra)) \
        if extra else None
    sig = key.signature
    t_in, t_out = torch_dtype(sig.dtype), torch_dtype(sig.dtype_c)
    act = None if sig.activation == "none" else sig.activation

    def launch(problem, tensors):
        a, b = tensors["a"], tensors["b"]
        if a.dtype != t_in:   # numpy storage (float32 for bf16/fp8) arriving through to_backend
            a, b = a.to(t_in), b.to(t_in)
        ds = tuple(tensors[f"d{i}"] for i in range(problem.num_d))
        ds = tuple(d if d.dtype == t_out else d.to(t_out) for d in ds)
        if problem.preshuffle:   # B pre-shuffled for the key's tile (its shape is checked by the launcher)
            c = gemm(a.reshape(a.shape[-2:]), b, layout=problem.layout, config=cfg, d_tensors=ds, d_op=problem.d_op,
                     activation=act, out_dtype=t_out, num_sms=num_sms, kernel_name=key.name, launch=via,
                     packed_n=problem.n)
            return {"c": c}
        if problem.batch == 1:   # a leading batch of 1 is no batch (no broadcast operand for descriptors)
            a, b = a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:])
        if tuple(a.shape[-2:]) != problem.shape_a()[-2:] or tuple(b.shape[-2:]) != problem.shape_b()[-2:]:
            raise InvalidProblem(f"tensor shapes {tuple(a.shape)} / {tuple(b.shape)} do not match "
                                 f"{problem.shape_a()} / {problem.shape_b()} ({problem.layout})")
        c = gemm(a, b, layout=problem.layout, config=cfg, d_tensors=ds, d_op=problem.d_op,
                 activation=act, out_dtype=t_out, num_sms=num_sms, kernel_name=key.name, launch=via)
        return {"c": c}

    return launch


# -- the fast path ----------------------------------------------------------------------
#
# ``ck_gemm.backends.triton.gemm`` checks and derives everything on each call (tens of
# microseconds of Python).  A dispatcher launcher is bound to one key and sees the
# same problem again and again, so it records the launch of the first call per
# problem signature (kernel, grid, arguments) and afterwards only swaps in the new
# tensors: the per-call cost is one dict lookup and the bare Triton launch.


class _Recorded:
    """The launches of one call (one, or a split-K GEMM and its reduction): ``steps`` of
    ``(launch, args, slots, descs)`` where ``slots`` / ``descs`` are ``(arg index, role)`` of the
    tensors / tensor descriptors to swap in (roles ``a``, ``b``, ``c`` and ``ws``, the split-K
    workspace, allocated anew per call as ``ws``'s ``(shape, dtype)``)."""

    __slots__ = ("steps", "ws", "replay")


def _record(cfg, problem, a, b, c, t_out, act, num_sms=None, name=None, extra=None, ds=()):
    """Run the full launcher once, capturing the kernel launches it makes.

    The kernel comes from the kernel cache under ``name`` (the key's name: what
    ``ck build`` compiled).  Where the compiled kernel can be replayed
    (``ck_core.backends.triton_replay``: CUDA, no profiler hooks) later calls skip
    Triton's per-call argument binding and reuse the tensor-map of each operand
    address; elsewhere they go through the cache's launch with the recorded arguments.
    Operands are told apart by their data pointers (a transposed view has its tensor's):
    None where two of them share one, or a launch takes a tensor that is none of them.
    Tensors in the device's scratch buffers (``launch.scratch``: split-K partials, the
    stream-K workspace and tile counters) stay those of the recorded call.
    """
    import torch

    from ck_core.backends import triton_replay

    from . import launch as L

    captured = []

    def capture(spec, vals, M, N, batch, kname):
        fn, args, opts = L.call_of(spec, vals)
        grid = spec.grid(M, N, batch)
        gpu = triton_replay.replayable(a)
        replay = triton_replay.record(fn, grid, args, opts, name=kname, extra=extra) if gpu else None
        if replay is None and gpu:
            log.debug("gemm %s: no replay, recorded launches through the cache", kname)
        elif replay is None:
            L._launch(spec, vals, M, N, batch, kname, extra)
        captured.append((spec, grid, kname, fn, args, opts, replay))

    L.gemm(a, b, layout=problem.layout, config=cfg, c=c, out_dtype=t_out, activation=act,
           num_sms=num_sms, kernel_name=name, launch=capture, d_tensors=ds, d_op=problem.d_op,
           packed_n=problem.n if problem.preshuffle else None)
    roles = {a.data_ptr(): "a", b.data_ptr(): "b", c.data_ptr(): "c"}
    roles.update((d.data_ptr(), f"d{i}") for i, d in enumerate(ds))
    if len(roles) != 3 + len(ds):
        return None
    rec = _Recorded()
    rec.steps, rec.ws, rec.replay = [], None, captured[0][6]
    for spec, grid, kname, fn, args, opts, replay in captured:
        if replay is not None:
            launch, args = replay, list(replay.args)
        else:
            launch = functools.partial(_cache_launch, kname, fn, grid, opts, extra)
            args = list(args)
        slots, descs = [], []
        for i, v in enumerate(args):
            desc = not isinstance(v, torch.Tensor) and isinstance(getattr(v, "base", None), torch.Tensor)
            t = v.base if desc else v
            if not isinstance(t, torch.Tensor):
                continue
            role = roles.get(t.data_ptr())
            if role is None and L.is_scratch(t):
                continue   # the device's scratch (split-K partials, stream-K workspace, counters): kept
            if role is None and rec.ws is None:   # a workspace made for the call
                role = roles[t.data_ptr()] = "ws"
                rec.ws = (tuple(t.shape), t.dtype)
            elif role is None:
                return None
            (descs if desc else slots).append((i, role))
        # no reference to this call's tensors (its output, a copy of an operand, the workspace): each
        # call passes its own in these slots, and a CUDA graph's pool must hold nothing of this call
        for i, _ in slots:
            args[i] = None
        for i, _ in descs:
            args[i] = _with_base(args[i], None)
        if replay is not None:
            for i, _ in slots:
                replay.args[i] = None
        rec.steps.append((launch, args, tuple(slots), tuple(descs)))
    return rec


def _with_base(desc, base):
    """A copy of the tensor descriptor ``desc`` around ``base`` (same shape, strides and block)."""
    d = object.__new__(type(desc))
    d.__dict__.update(desc.__dict__)
    d.base = base
    return d


def _cache_launch(kname, fn, grid, opts, extra, args):
    from ck_core.backends import triton_artifacts

    triton_artifacts.launch(kname, fn, grid, args, opts, extra=extra)


def _fast_call(rec, a, b, c, ds=()):
    vals = {"a": a, "b": b, "c": c}
    for i, d in enumerate(ds):
        vals[f"d{i}"] = d
    if rec.ws is not None:
        import torch

        vals["ws"] = torch.empty(rec.ws[0], dtype=rec.ws[1], device=c.device)
    for launch, args, slots, descs in rec.steps:
        args = args.copy()
        for i, role in slots:
            args[i] = vals[role]
        for i, role in descs:
            # same shape, strides and alignment as the recorded descriptor (the cache key
            # guarantees it): copy it without re-running TensorDescriptor's validation
            args[i] = _with_base(args[i], vals[role])
        launch(args)
    return c


def bare_launch(key, problem, a, b, replay: bool = False):
    """Baselines for benchmarks: the recorded launch with fixed arguments.

    ``replay=False``: ``kernel[grid](*args)``, the plain Triton launch a user would
    write; ``replay=True``: the compiled kernel's own launcher (the floor).
    """
    import torch

    cfg = config_of(key)
    t_out = torch_dtype(key.signature.dtype_c)
    c = torch.empty(problem.shape_c(), device=a.device, dtype=t_out)
    from ck_core.backends import triton_artifacts

    rec = _record(cfg, problem, a, b, c, t_out, None, name=key.name,
                  extra=triton_artifacts.compile_options(key))
    if replay:
        if rec is None or rec.replay is None or len(rec.steps) != 1 or rec.ws is not None:
            return None
        launch, args, slots = rec.steps[0][:3]
        args, vals = args.copy(), {"a": a, "b": b, "c": c}
        for i, role in slots:   # (the recording keeps no tensor: the operands go back in)
            args[i] = vals[role]
        return lambda: launch(args)
    from . import launch as L

    captured = []
    L.gemm(a, b, layout=problem.layout, config=cfg, c=c, out_dtype=t_out,
           launch=lambda spec, vals, M, N, batch, name: captured.append((spec, vals, M, N, batch)),
           packed_n=problem.n if problem.preshuffle else None)
    spec, vals, M, N, batch = captured[0]
    fn, args, opts = L.call_of(spec, vals)
    bound = fn[spec.grid(M, N, batch)]
    return lambda: bound(*args, **opts)


def make_fast_launcher(key, num_sms=None):
    """Like :func:`make_launcher`, with the recorded fast path for plain GEMMs."""
    import torch

    from ck_core.backends import triton_artifacts, triton_replay

    general = make_launcher(key, num_sms)
    cfg = config_of(key)
    sig = key.signature
    t_in, t_out = torch_dtype(sig.dtype), torch_dtype(sig.dtype_c)
    recorded: dict = {}

    act = None if sig.activation == "none" else sig.activation

    def launch(problem, tensors):
        a, b = tensors["a"], tensors["b"]
        ds = tuple(tensors[f"d{i}"] for i in range(problem.num_d))
        if a.dtype != t_in or b.dtype != t_in or not triton_replay.replayable(a) \
                or any(d.dtype != t_out for d in ds):
            return general(problem, tensors)
        c = tensors.get("c")
        rec = recorded.get(_sig(problem, a, b, c, ds))
        if c is None:
            c = torch.empty(problem.shape_c(), device=a.device, dtype=t_out)
        if rec is None:
            if tuple(a.shape) != problem.shape_a() or tuple(b.shape) != problem.shape_b():
                raise InvalidProblem(f"tensor shapes {tuple(a.shape)} / {tuple(b.shape)} do not "
                                     f"match {problem.shape_a()} / {problem.shape_b()}")
            if tuple(c.shape) != problem.shape_c() or c.dtype != t_out:
                raise InvalidProblem(f"c is {tuple(c.shape)} {c.dtype}; expected {problem.shape_c()} {t_out}")
            rec = _record(cfg, problem, a, b, c, t_out, act, num_sms, name=key.name,
                          extra=triton_artifacts.compile_options(key), ds=ds)
            recorded[_sig(problem, a, b, tensors.get("c"), ds)] = False if rec is None else rec
            return {"c": c}
        if rec is False:
            return general(problem, tensors)
        return {"c": _fast_call(rec, a, b, c, ds)}

    def warm(problem, tensors, out_shape=None):
        """``f(a, b[, d]) -> C`` for later calls like the recorded one (same problem, shapes,
        strides, alignment, device: the caller's signature pins them), or None; ``d``: the problem's
        D tensors (``d0``, ``d1``) in order, ignored without them.  C is
        allocated as ``out_shape`` (the caller's view of C's storage; default the problem's)."""
        a, b = tensors["a"], tensors["b"]
        ds = tuple(tensors.get(f"d{i}") for i in range(problem.num_d))
        if "c" in tensors or len(tensors) != 2 + len(ds) or any(d is None for d in ds):
            return None
        rec = recorded.get(_sig(problem, a, b, None, ds))
        if not rec:
            return None
        if ds:   # the general form: a dict of roles per call
            def fast_d(a, b, d=()):
                return _fast_call(rec, a, b, empty(shape, device=dev, dtype=t_out), d)

            shape, dev, empty = tuple(out_shape or problem.shape_c()), a.device, torch.empty
            return fast_d
        shape, dev, empty = tuple(out_shape or problem.shape_c()), a.device, torch.empty
        one = rec.steps[0] if len(rec.steps) == 1 and rec.ws is None else None
        roles = sorted(role for _, role in one[2]) if one is not None else None
        if one is None or one[3] or roles != ["a", "b", "c"]:
            def fast(a, b, d=None):
                return _fast_call(rec, a, b, empty(shape, device=dev, dtype=t_out))

            return fast
        # one launch, one slot per operand (the plain and the replayed-descriptor launches): no loops
        from ck_core.warm import contiguous_strides

        run, template = one[0], one[1]
        slot = {role: i for i, role in one[2]}
        ia, ib, ic = slot["a"], slot["b"], slot["c"]
        stride, empty_strided = contiguous_strides(shape), torch.empty_strided

        def fast(a, b, d=None):
            c = empty_strided(shape, stride, dtype=t_out, device=dev)
            args = template.copy()
            args[ia] = a
            args[ib] = b
            args[ic] = c
            run(args)
            return c

        return fast

    launch.warm = warm
    return launch


def _sig(problem, a, b, c, ds=()) -> tuple:
    """What a recording depends on beyond the problem: the operands' storage (the kernel
    reads only their data pointers; its integer arguments and specialisation come from these)."""
    return (problem, a.shape, b.shape, a.stride(), b.stride(), a.data_ptr() % 16, b.data_ptr() % 16,
            a.device.index, None if c is None else (c.shape, c.stride(), c.data_ptr() % 16, c.dtype),
            *[(d.shape, d.stride(), d.data_ptr() % 16) for d in ds])
