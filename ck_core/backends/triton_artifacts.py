"""Built is what runs: Triton kernels compiled into, and loaded from, the KernelCache.

A launcher calls :func:`launch` (``launch(name, fn, grid, args, kwargs)``) where it
would write ``fn[grid](*args, **kwargs)``.  The call is specialised by Triton's own
binder, exactly as the JIT would (pointer alignment, integers equal to 1 or divisible
by 16, constexprs, options), so an artifact never runs arguments it was not compiled
for: the specialisation is part of the cache key.  The compiled kernel is looked up

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


def unpack(blob: bytes, src, name_hint: Optional[str] = None):
    """A CompiledKernel of ``src`` from a :func:`pack` blob; ValueError if it is not one."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import AsmDict, CompiledKernel

    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 8:
        raise ValueError("not a ck triton artifact")
    (n,) = struct.unpack_from("<Q", blob, len(_MAGIC))
    start = len(_MAGIC) + 8
    if n > len(blob) - start:
        raise ValueError("truncated header")
    meta = json.loads(blob[start:start + n])
    binary = blob[start + n:]
    if not isinstance(meta, dict) or not binary or not isinstance(meta.get("target"), dict):
        raise ValueError("malformed metadata")
    t = meta["target"]
    meta["target"] = GPUTarget(t["backend"], t["arch"], t["warp_size"])
    if name_hint is not None and meta.get("name") != name_hint:
        raise ValueError(f"kernel {meta.get('name')!r}, expected {name_hint!r}")
    ck = object.__new__(CompiledKernel)   # CompiledKernel.__init__ reads files; this is its in-memory twin
    ck.metadata = namedtuple("KernelMetadata", sorted(meta))(**meta)
    backend = _backend(ck.metadata.target)
    ck.packed_metadata = backend.pack_metadata(ck.metadata)
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
    bound, spec, opts = _binder(fn, target)(*args, **kw)
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

    def valid(blob, meta):
        try:
            unpack(blob, src, meta.get("triton_name"))
            return True
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("cache entry of %s does not hold a kernel (%s); rebuilding it", name, exc)
            return False

    blob, meta, hit = cache.get_or_build(name, material, build, validate=valid)
    if built:
        STATS["compiled"] += 1
        return built[0], "compiled"
    STATS["loaded"] += 1
    return unpack(blob, src, meta.get("triton_name")), "loaded" if hit else "compiled"


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
    bound, spec, opts = _binder(fn, target)(*args, **kw)
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
    ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata,
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
