"""The triton backend: JIT on a GPU, ahead-of-time for any arch's target.

* compile: the op plugin renders a key (``OpSpec.render(key, "triton")``).  A
  rendering with ``jit_calls()`` (a representative launch of the key's kernels)
  is compiled through :mod:`.triton_artifacts` into the very entries the
  launchers load (built is what runs); otherwise ``compile(target)`` (a
  ``triton.compile`` of an ``ASTSource``) and ``source_hash`` give a code object
  (hsaco / cubin) and its metadata in the :class:`ck_core.cache.KernelCache`,
  which no launcher reads (keys whose rendering offers no ``jit_calls``).
* execute: kernels run where torch sees a matching GPU, or anywhere under
  ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, for tests).

triton and torch are imported lazily; without them the backend says so.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Optional

from .. import __version__
from ..errors import CompileError, ToolchainMissing
from ..hookspecs import hookimpl
from ..records import BackendSpec

log = logging.getLogger(__name__)


from ..knobs import interpreting  # noqa: E402,F401  (one reader of TRITON_INTERPRET)


def refuse_interpreted_bf16(dtype: str, name: str) -> None:
    """UnsupportedProblem for a bf16 ``tl.dot`` kernel under the interpreter, where Triton's CPU
    interpreter returns garbage for it (relative errors ~1e9, even in a 16x16 one-line kernel).
    Called when a launcher is made (selection is left alone: it is the same on a GPU)."""
    if dtype == "bf16" and interpreting():
        from ..errors import UnsupportedProblem

        raise UnsupportedProblem(f"{name}: Triton's CPU interpreter (TRITON_INTERPRET=1) computes bf16 dot "
                                 "products wrongly; run bf16 on a GPU, use fp16/fp32 here, or unset "
                                 "TRITON_INTERPRET (the numpy backend runs bf16 on CPU tensors)")


@functools.lru_cache(maxsize=None)
def _triton_version() -> Optional[str]:
    try:
        import triton
    except Exception:  # ImportError, or a broken install
        return None
    return triton.__version__


def available():
    v = _triton_version()
    if v is None:
        return False, "triton is not installed: pip install 'ck-core[triton]' (triton==3.6.0)"
    return True, f"triton {v}"


@functools.lru_cache(maxsize=None)
def _device_target():
    """(backend, arch) of the visible GPU, or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    if getattr(torch.version, "hip", None):
        name = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        return ("hip", name)
    major, minor = torch.cuda.get_device_capability(0)
    return ("cuda", major * 10 + minor)


def can_execute(arch):
    ok, why = available()
    if not ok:
        return False, why
    if interpreting():
        return True, "TRITON_INTERPRET=1 (CPU interpreter)"
    if arch.triton_target is None:
        return False, f"arch {arch.name} has no triton target"
    dev = _device_target()
    if dev is None:
        return False, ("no GPU visible to torch; compile ahead of time with `ck build --backend "
                       "triton`, or set TRITON_INTERPRET=1 to run kernels on the CPU")
    if (arch.triton_target[0], arch.triton_target[1]) != dev:
        return False, f"the GPU here is {dev[0]}:{dev[1]}, not {arch.name}"
    return True, ""


def device():
    import torch

    return "cpu" if interpreting() or not torch.cuda.is_available() else "cuda"


def to_backend(x):
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device())
    return torch.from_numpy(np.ascontiguousarray(x)).to(device())


def to_numpy(x):
    from .numpy_backend import _to_numpy

    return _to_numpy(x)


def synchronize():
    import torch

    if torch.cuda.is_available() and not interpreting():
        torch.cuda.synchronize()


def timer(fn, repeat: int = 20) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU, wall clock otherwise)."""
    import torch

    if device() == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=max(repeat, 20), return_mode="median") * 1e-3
    fn()
    times = []
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def compile_key(key, op, arch, opts: dict) -> dict:
    """AOT-compile one key for ``arch``'s target through the cache; returns metadata."""
    ok, why = available()
    if not ok:
        raise ToolchainMissing(why)
    if op.render is None:
        raise CompileError(f"op {op.name} has no triton templates (OpSpec.render is None)")
    from ..cache import KernelCache
    from ..plugins import get_manager

    rendered = op.render(key, "triton")
    target = arch.gpu_target()
    extra = get_manager().hook.ck_compile_options(key=key, arch=arch, backend="triton") or {}
    material = {"core": __version__, "template": rendered.source_hash, "compiler": "triton",
                "compiler_version": _triton_version(), "target": [target.backend, str(target.arch),
                                                                  target.warp_size],
                "options": {**getattr(rendered, "options", {}), **extra}}
    cache = KernelCache(opts.get("cache_root"))

    def build():
        t0 = time.perf_counter()
        try:
            ck = rendered.compile(target, **({"extra_options": extra} if extra else {}))
        except CompileError:
            raise
        except Exception as exc:
            raise CompileError(f"{key.name}: triton.compile for {target} failed: "
                               f"{type(exc).__name__}: {str(exc)[:400]}") from exc
        kind = "hsaco" if "hsaco" in ck.asm else "cubin"
        md = ck.metadata
        meta = {"target": f"{target.backend}:{target.arch}", "binary": kind,
                "shared": int(getattr(md, "shared", 0)), "n_regs": int(getattr(ck, "n_regs", -1) or -1),
                "n_spills": int(getattr(ck, "n_spills", -1) or -1),
                "num_warps": int(getattr(md, "num_warps", 0)),
                "compile_seconds": round(time.perf_counter() - t0, 3)}
        return ck.asm[kind], meta

    calls = getattr(rendered, "jit_calls", None)
    if calls is not None and not opts.get("force"):
        return _compile_calls(key, calls(), target, extra, opts.get("cache_root"), _entry_prefix(key, rendered))
    if opts.get("force"):
        blob_meta = build()
        return dict(blob_meta[1], cache_hit=False, bytes=len(blob_meta[0]))
    blob, meta, hit = cache.get_or_build(key.name, material, build)
    return dict(meta, cache_hit=hit, bytes=len(blob))


def _entry_prefix(key, rendered) -> str:
    """The name the kernel-cache entries of ``key``'s launches start with: the rendering's
    ``artifact_name`` where the op gives one (keys whose kernels are compiled alike share it: an
    op whose kernels take a size as a run-time argument names the entry by the size's class),
    else the key's name."""
    return getattr(rendered, "artifact_name", None) or key.name


def _compile_calls(key, calls, target, extra, cache_root, prefix=None) -> dict:
    """Build a key's kernels as its launcher calls them (``rendered.jit_calls()``: a
    representative launch of each, ``(suffix, fn, args, kwargs)``) into the entries the
    launcher loads (:mod:`ck_core.backends.triton_artifacts`): ``<prefix><suffix>``, the
    prefix :func:`_entry_prefix` (a shared helper's own name: ``triton_artifacts.entry_name``)."""
    prefix = prefix or key.name
    from . import triton_artifacts as ta

    t0 = time.perf_counter()
    hows, kernels = [], {}
    for suffix, fn, args, kwargs in calls:
        if not hasattr(fn, "params"):
            raise CompileError(f"{key.name}: the kernel is not a JITFunction (TRITON_INTERPRET=1?); "
                               "compile ahead of time in a process without TRITON_INTERPRET")
        ck, how = ta.get_or_build(ta.entry_name(prefix, suffix), fn, args, kwargs, target=target,
                                  cache_root=cache_root, extra=extra)
        hows.append(how)
        md = ck.metadata
        kernels[ta.entry_name(prefix, suffix)] = {"shared": int(getattr(md, "shared", 0)),
                                      "num_warps": int(getattr(md, "num_warps", 0))}
    first = next(iter(kernels.values()))
    return {"target": f"{target.backend}:{target.arch}", "binary": ta._backend(target).binary_ext,
            "shared": first["shared"], "num_warps": first["num_warps"], "kernels": kernels,
            "cache_hit": all(h == "loaded" for h in hows),
            "compile_seconds": round(time.perf_counter() - t0, 3)}


def build_for_problem(key, op, arch, problem) -> bool:
    """Compile ``key``'s kernels as its launcher calls them on ``problem`` (that problem's
    specialisation: alignment, divisibility, unit sizes) into the kernel cache, without a GPU,
    and build Triton's launcher stubs where a driver is present: a later first call on a
    problem of that specialisation only loads.  False when the op's rendering cannot trace a
    launch on a problem (``jit_calls(problem)``); the first call compiles then."""
    import inspect

    from . import triton_artifacts as ta

    rendered = op.render(key, "triton")
    calls = getattr(rendered, "jit_calls", None)
    if calls is None or "problem" not in inspect.signature(calls).parameters:
        return False
    extra = ta.compile_options(key)
    for suffix, fn, args, kwargs in calls(problem):
        ck, _ = ta.get_or_build(ta.entry_name(_entry_prefix(key, rendered), suffix), fn, args, kwargs,
                                target=arch.gpu_target(), extra=extra)
        try:   # the launcher stub is a C build per argument signature (Triton caches it)
            from triton.runtime import driver

            driver.active.launcher_cls(ck.src, ck.metadata)
        except Exception as exc:  # noqa: BLE001 - no CUDA driver here: the first call builds it
            log.debug("no launcher stub for %s: %s", key.name, exc)
    return True


@hookimpl
def ck_register_backends():
    return [BackendSpec(
        name="triton", available=available, can_execute=can_execute, to_backend=to_backend,
        to_numpy=to_numpy, compile=compile_key, synchronize=synchronize, timer=timer,
        description="Triton: JIT on NVIDIA/AMD GPUs, AOT code objects for every arch target",
    )]
