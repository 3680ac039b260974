"""Built is what runs: Triton kernels compiled into, and loaded from, the KernelCache.

A launcher calls :func:`launch` (``launch(name, fn, grid, args, kwargs)``) where it
would write ``fn[grid](*args, **kwargs)``.  The call is specialised by Triton's own
binder, as the JIT would (pointer alignment, integers equal to 1 or divisible by 16,
constexprs, options), under the kernel's declared policy (:func:`specialisation`:
sizes are run-time values, alignment-class integers specialise on divisibility by 16
only), so an artifact never runs arguments it was not compiled for: the specialisation
(signature, constants, attributes) is part of the cache key and of the entry's record.  The compiled kernel is looked up

1. in this process (a dict keyed by name, function and specialisation),
2. in the :class:`ck_core.cache.KernelCache` (the entry ``ck build`` writes: same
   kernel name, template hash (``fn.cache_key``: the source and what it calls),
   compiler version, options and target), loaded without compiling,
3. and only then compiled (``triton.compile`` of the same ``ASTSource`` the JIT would
   build) and written to the cache.

``ck build`` reaches the same entries through :func:`get_or_build` with a
representative call of the kernel (an op plugin's ``rendered.jit_calls()``).

An entry holds Triton's kernel metadata and the code object in one blob whose
SHA-256 the cache record carries; a blob that does not parse back into a kernel of
that name for that target is removed and rebuilt.  Under ``TRITON_INTERPRET=1``
:func:`launch` is the plain ``fn[grid](...)``.  Written against triton 3.6.
"""
from __future__ import annotations

import functools
import json
import logging
import struct
import time
from collections import namedtuple
from typing import Optional

from .. import __version__
from ..errors import CompileError

log = logging.getLogger(__name__)

_MAGIC = b"CKTRITON1\n"
#: (name, fn, specialisation, target, cache root) -> CompiledKernel, for this process
_LOADED: dict = {}
#: what this process did, for tests and benchmarks: compiled / loaded from disk / hits in memory
STATS = {"compiled": 0, "loaded": 0, "memory": 0}


from ..knobs import interpreting  # noqa: E402,F401  (one reader of TRITON_INTERPRET)


@functools.lru_cache(maxsize=None)
def current_target():
    from triton.runtime import driver

    return driver.active.get_current_target()


@functools.lru_cache(maxsize=None)
def _backend(target):
    from triton.compiler.compiler import make_backend

    return make_backend(target)


@functools.lru_cache(maxsize=None)
def _binder(fn, target):
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(fn.signature, fn.params, _backend(target))


def specialisation(*, runtime=(), align_only=(), groups=()):
    """Decorator (outside ``@triton.jit``): what a kernel's integer arguments specialise on.

    ``runtime``: sizes (batch, heads, sequence lengths, M/N/K, spatial sizes, counts) the
    code does not depend on: plain run-time integers (Triton's ``do_not_specialize``), so
    every value loads one compiled kernel.  ``align_only``: integers whose divisibility
    by 16 lets loads and stores vectorise (strides, sizes along a contiguous dimension):
    they specialise on that alone (two classes), never on being 1 (Triton makes an
    integer equal to 1 a constant: one more compile for a unit size).  ``groups``: sets
    of ``align_only`` names (one tensor's strides) that are one alignment class: all
    divisible by 16, or all taken as not (a tensor whose rows are unaligned gains nothing
    from an aligned batch stride, which would only split its compiles by size).  Other
    integers keep Triton's default.  A name the kernel does not take is a TypeError (a
    typo would silently specialise)."""
    runtime = tuple(runtime)
    groups = tuple(tuple(g) for g in groups)
    align_only = frozenset(align_only) | frozenset(n for g in groups for n in g)

    def deco(fn):
        params = getattr(fn, "params", None)
        if params is None:   # not a JITFunction (nothing specialises)
            return fn
        names = {p.name for p in params}
        unknown = (set(runtime) | align_only) - names
        if unknown:
            raise TypeError(f"{getattr(fn, '__name__', fn)}: no argument(s) {sorted(unknown)}")
        for p in params:
            if p.name in runtime:
                p.do_not_specialize = True
        dns = tuple(fn.do_not_specialize or ())
        fn.do_not_specialize = dns + tuple(n for n in runtime if n not in dns)
        fn.ck_align_only = align_only | frozenset(getattr(fn, "ck_align_only", ()))
        fn.ck_align_groups = tuple(getattr(fn, "ck_align_groups", ())) + groups
        return fn
    return deco


@functools.lru_cache(maxsize=None)
def _align_policy(fn) -> tuple:
    """(indices of align-only arguments, index groups) of ``fn``."""
    index = {p.name: i for i, p in enumerate(fn.params) if not p.is_constexpr}
    names = getattr(fn, "ck_align_only", ())
    return (tuple(index[n] for n in names if n in index),
            tuple(tuple(index[n] for n in g if n in index) for g in getattr(fn, "ck_align_groups", ())))


def _bind(fn, target, args, kw):
    """Triton's binder of ``fn`` under the kernel's :func:`specialisation` policy."""
    bound, spec, opts = _binder(fn, target)(*args, **kw)
    single, groups = _align_policy(fn)
    for i in single:
        if spec[i][0] == "constexpr":   # an integer equal to 1: not divisible by 16, no constant
            spec[i] = ("i32", "")
    for g in groups:
        if any(spec[i][1] != "D" for i in g):
            for i in g:
                spec[i] = (spec[i][0], "")
    return bound, spec, opts


def _jit_kwargs(fn, kwargs: dict, extra: Optional[dict]) -> dict:
    """The keyword arguments JITFunction.run adds before binding (debug, instrumentation)."""
    from triton import knobs

    kw = dict(kwargs, **(extra or {}))
    kw["debug"] = kw.get("debug", fn.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    return kw


def _material(fn, target, options, signature, constexprs, attrs) -> dict:
    opts = dict(options.__dict__)
    # library paths differ between installs; the library names are what matter
    opts["extern_libs"] = [n for n, _ in opts.get("extern_libs") or ()]
    return {"core": __version__, "template": fn.cache_key, "compiler": "triton",
            "compiler_version": _triton_version(), "target": [target.backend, str(target.arch),
                                                              target.warp_size],
            "signature": signature, "constexprs": sorted((str(k), repr(v)) for k, v in constexprs.items()),
            "attrs": sorted((str(k), v) for k, v in attrs.items()), "options": opts}


@functools.lru_cache(maxsize=None)
def _triton_version() -> str:
    import triton

    return triton.__version__


def pack(ck) -> bytes:
    """Triton's metadata of ``ck`` and its code object, as one blob."""
    backend = _backend(ck.metadata.target)
    head = json.dumps(ck.metadata._asdict(), default=vars).encode()
    return _MAGIC + struct.pack("<Q", len(head)) + head + bytes(ck.asm[backend.binary_ext])


#: Triton metadata a launch reads (pack_metadata, launch_metadata, the launcher stub): an entry
#: without one of them is not a kernel this process can run
_REQUIRED = {"name": str, "num_warps": int, "num_ctas": int, "shared": int}


def unpack(blob: bytes, src, name_hint: Optional[str] = None, target=None):
    """A CompiledKernel of ``src`` from a :func:`pack` blob; ValueError if it is not one
    (not ours, truncated, metadata missing or of the wrong type, another kernel's name, built
    for another ``target``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import AsmDict, CompiledKernel

    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 8:
        raise ValueError("not a ck triton artifact")
    (n,) = struct.unpack_from("<Q", blob, len(_MAGIC))
    start = len(_MAGIC) + 8
    if n > len(blob) - start:
        raise ValueError("truncated header")
    try:
        meta = json.loads(blob[start:start + n])
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"metadata is not JSON: {type(exc).__name__}") from None
    binary = blob[start + n:]
    if not isinstance(meta, dict) or not binary or not isinstance(meta.get("target"), dict):
        raise ValueError("malformed metadata")
    for k, ty in _REQUIRED.items():
        if not isinstance(meta.get(k), ty) or isinstance(meta.get(k), bool):
            raise ValueError(f"metadata field {k!r} missing or not {ty.__name__}")
    t = meta["target"]
    if not (isinstance(t.get("backend"), str) and isinstance(t.get("arch"), (int, str))
            and isinstance(t.get("warp_size"), int)):
        raise ValueError("malformed target")
    meta["target"] = GPUTarget(t["backend"], t["arch"], t["warp_size"])
    if target is not None and (meta["target"].backend, str(meta["target"].arch), meta["target"].warp_size) \
            != (target.backend, str(target.arch), target.warp_size):
        raise ValueError(f"built for {meta['target']}, not {target}")
    if name_hint is not None and meta.get("name") != name_hint:
        raise ValueError(f"kernel {meta.get('name')!r}, expected {name_hint!r}")
    ck = object.__new__(CompiledKernel)   # CompiledKernel.__init__ reads files; this is its in-memory twin
    try:
        ck.metadata = namedtuple("KernelMetadata", sorted(meta))(**meta)
        backend = _backend(ck.metadata.target)
        ck.packed_metadata = backend.pack_metadata(ck.metadata)
    except Exception as exc:  # noqa: BLE001 - an unknown backend, a field name namedtuple refuses
        raise ValueError(f"metadata Triton cannot use: {type(exc).__name__}: {str(exc)[:200]}") from None
    ck.src, ck.hash, ck.name = src, None, ck.metadata.name
    ck.asm = AsmDict({backend.binary_ext: binary})
    ck.metadata_group, ck.kernel = {}, binary
    ck.module = ck.function = ck._run = None
    return ck


def _ast_source(fn, signature, constexprs, attrs):
    """The source object the JIT would compile: Gluon kernels have their own (GluonASTSource)."""
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as cls
    else:
        from triton.compiler import ASTSource as cls
    return cls(fn, signature, constexprs, attrs)


def specialise(fn, args, kwargs: dict, target, extra: Optional[dict] = None):
    """``(bound arguments, ASTSource, options, material)`` of one call, as the JIT would compile it."""
    kw = _jit_kwargs(fn, kwargs, extra)
    bound, spec, opts = _bind(fn, target, args, kw)
    options, signature, constexprs, attrs = fn._pack_args(_backend(target), kw, bound, spec, opts)
    src = _ast_source(fn, signature, constexprs, attrs)
    return bound, src, options, _material(fn, target, options, signature, constexprs, attrs)


def get_or_build(name: str, fn, args, kwargs: dict, *, target=None, cache_root=None,
                 extra: Optional[dict] = None):
    """``(CompiledKernel, how)`` for one call of ``fn``: how is "memory", "loaded" or "compiled"."""
    target = target or current_target()
    bound, src, options, material = specialise(fn, args, kwargs, target, extra)
    ck, how = _get_or_build(name, src, options, material, target, cache_root)
    return ck, how


def _get_or_build(name, src, options, material, target, cache_root):
    from ..cache import KernelCache

    cache = KernelCache(cache_root)
    built = []

    def build():
        import triton

        t0 = time.perf_counter()
        try:
            ck = triton.compile(src, target=target, options=options.__dict__)
        except Exception as exc:  # noqa: BLE001 - the compiler raises many kinds
            raise CompileError(f"{name}: triton.compile for {target} failed: "
                               f"{type(exc).__name__}: {str(exc)[:400]}") from exc
        built.append(ck)
        md = ck.metadata
        meta = {"target": f"{target.backend}:{target.arch}", "binary": _backend(target).binary_ext,
                "triton_name": md.name, "shared": int(getattr(md, "shared", 0)),
                "num_warps": int(getattr(md, "num_warps", 0)),
                "compile_seconds": round(time.perf_counter() - t0, 3)}
        return pack(ck), meta

    loaded = []

    def valid(blob, meta):
        """Any entry this process cannot run is absent: it is rebuilt, never raised."""
        try:
            loaded[:] = [unpack(blob, src, meta.get("triton_name"), target)]
            return True
        except Exception as exc:  # noqa: BLE001 - whatever a damaged entry makes the parser raise
            log.warning("cache entry of %s does not hold a kernel this process can run (%s); "
                        "rebuilding it", name, exc)
            return False

    blob, meta, hit = cache.get_or_build(name, material, build, validate=valid)
    if built:
        STATS["compiled"] += 1
        return built[0], "compiled"
    STATS["loaded"] += 1
    return (loaded[0] if loaded else unpack(blob, src, meta.get("triton_name"), target)), \
        "loaded" if hit else "compiled"


_OPTIONS: dict = {}


def compile_options(key) -> dict:
    """The extra compile options plugins ask for ``key`` (hook ``ck_compile_options``), as
    ``ck build`` passes them: part of the cache key, so a launcher must pass them too."""
    got = _OPTIONS.get(key.name)
    if got is None:
        from ..plugins import get_manager

        mgr = get_manager()
        got = _OPTIONS[key.name] = dict(
            mgr.hook.ck_compile_options(key=key, arch=mgr.arch(key.arch), backend="triton") or {})
    return got


def kernel_for_call(name: str, fn, args, kwargs: dict, *, cache_root=None, extra: Optional[dict] = None):
    """``(CompiledKernel, bound argument values)`` of a call on this device (memoised per specialisation)."""
    target = current_target()
    kw = _jit_kwargs(fn, kwargs, extra)
    bound, spec, opts = _bind(fn, target, args, kw)
    memo = (name, fn, str(spec), str(opts), cache_root)
    ck = _LOADED.get(memo)
    if ck is None:
        options, signature, constexprs, attrs = fn._pack_args(_backend(target), kw, bound, spec, opts)
        src = _ast_source(fn, signature, constexprs, attrs)
        ck, _ = _get_or_build(name, src, options,
                              _material(fn, target, options, signature, constexprs, attrs), target, cache_root)
        _LOADED[memo] = ck
    else:
        STATS["memory"] += 1
    return ck, list(bound.values())


#: a key's launch whose name part (``suffix`` of an op's ``jit_calls``) starts with this names a kernel-cache
#: entry of its own, shared by every key that launches the kernel alike (a helper whose code depends on none
#: of the key's fields, only on its constexprs: the entry's material): the key's prefix is left off
SHARED = "//"


def entry_name(prefix: str, suffix: str) -> str:
    """The kernel-cache entry name of a key's launch: ``prefix + suffix`` (``<key>/<kernel>``), or the
    shared name a :data:`SHARED` suffix gives."""
    return suffix[len(SHARED):] if suffix.startswith(SHARED) else prefix + suffix


def launch(name: str, fn, grid, args, kwargs: dict, *, cache_root=None, extra: Optional[dict] = None):
    """``fn[grid](*args, **kwargs)`` with the kernel from the cache; returns the CompiledKernel.

    ``name``: the kernel key's name (a second kernel of one key adds a suffix,
    e.g. ``name + "/reduce"``); ``extra``: :func:`compile_options` of the key.
    Under TRITON_INTERPRET=1 this is the plain launch.
    """
    if interpreting() or not hasattr(fn, "params"):
        return fn[grid](*args, **kwargs)
    from triton import knobs
    from triton.runtime import driver

    ck, values = kernel_for_call(name, fn, args, kwargs, cache_root=cache_root, extra=extra)
    if callable(grid):
        grid = grid(dict(zip(fn.arg_names, values)))
    g = tuple(grid) + (1,) * (3 - len(grid))
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream(device)
    rt = knobs.runtime
    try:
        run = ck.run   # loads the code object: Triton's OutOfResources (shared memory, threads) is raised here
    except Exception as exc:  # noqa: BLE001 - the loader raises several kinds
        raise CompileError(f"{name}: the compiled kernel does not load on this device: {type(exc).__name__}: "
                           f"{str(exc)[:400]} (the Dispatcher falls back to its next candidate)") from exc
    run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata,
           ck.launch_metadata(g, stream, *values), rt.launch_enter_hook, rt.launch_exit_hook, *values)
    return ck


def bind(name: str, fn, grid, extra: Optional[dict] = None):
    """``fn[grid]`` through the kernel cache: ``bind(name, fn, grid)(*args, **kwargs)``
    is :func:`launch`; the one-line change a launcher written as ``fn[grid](...)`` needs."""
    return lambda *args, **kwargs: launch(name, fn, grid, args, kwargs, extra=extra)


def forget() -> None:
    """Drop this process's loaded kernels and option lookups (tests; a changed cache folder)."""
    _LOADED.clear()
    _OPTIONS.clear()
