"""Parallel build of a registry through each kernel's backend.

Kernels compile in a process pool (workers forked from a clean, preloaded
server: safe with CUDA and Triton), progress goes to stderr, and a kernel that fails is reported and
left out of the registry -- it never sinks the batch.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Optional

import attrs

from . import knobs
from .errors import CkError

log = logging.getLogger(__name__)


@attrs.define
class BuildReport:
    built: dict = attrs.field(factory=dict)      # name -> metadata
    failed: dict = attrs.field(factory=dict)     # name -> error text
    cache_hits: int = 0
    seconds: float = 0.0
    workers: int = 1

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        return (f"built {len(self.built)} kernels ({self.cache_hits} from cache), "
                f"{len(self.failed)} failed, {self.seconds:.2f} s with {self.workers} worker(s)")


#: environment variables a worker takes from the parent at each task: the fork server
#: (and so every worker) keeps the environment of its start, but a build must follow
#: the caller's current cache directories and knobs
_FORWARD_PREFIXES = ("CK_", "TRITON_")


def _forwarded_env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(_FORWARD_PREFIXES)}


def _apply_env(env: Optional[dict]) -> None:
    if env is None:
        return
    for k in [k for k in os.environ if k.startswith(_FORWARD_PREFIXES) and k not in env]:
        del os.environ[k]
    os.environ.update(env)


def _compile_one(key_dict: dict, cache_root: Optional[str], force: bool, env: Optional[dict] = None):
    """Worker entry point (module level so it pickles)."""
    from .key import KernelKey
    from .plugins import get_manager

    _apply_env(env)
    try:
        mgr = get_manager()
        key = KernelKey.from_dict(key_dict, manager=mgr)
        backend = mgr.backend(key.backend)
        meta = backend.compile(key, mgr.op(key.op), mgr.arch(key.arch),
                               {"cache_root": cache_root, "force": force})
        return key_dict["name"], meta or {}, None
    except CkError as exc:
        return key_dict["name"], None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a compiler crash is one kernel's failure, not the batch's
        return key_dict["name"], None, f"{type(exc).__name__}: {exc}"


def _die_with(parent_pid: int) -> None:
    """Pool initializer: a worker ends when the process that started the build ends.

    A killed ``ck build`` must not leave compilers running for minutes.  Workers are
    children of the fork server, which exits when the parent does; on Linux the kernel
    then kills the worker (PR_SET_PDEATHSIG).  A watchdog thread covers other systems
    and a parent that died before the worker started.
    """
    import signal
    import threading

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no libc prctl: the watchdog alone
            pass

    def alive() -> bool:
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by someone else (pid reused): treat as gone
            return False
        return True

    def watch():
        while alive():
            time.sleep(0.5)
        os._exit(1)

    if not alive():
        os._exit(1)
    threading.Thread(target=watch, name="ck-build-watchdog", daemon=True).start()


def _pool_context(keys):
    """Workers fork from a clean server process that has already imported the backends and
    plugins (no CUDA state is inherited; each worker starts in milliseconds, not seconds)."""
    if sys.platform == "win32":  # pragma: no cover
        return get_context("spawn")
    ctx = get_context("forkserver")
    preload = ["ck_core.build", "ck_core.backends.triton_backend", "ck_core._buildserver"]
    for key in keys[:1]:
        try:
            from .plugins import get_manager
            op = get_manager().op(key.op)
            preload.append(op.enumerate.__module__)
            if op.render is not None:
                preload.append(op.render.__module__)
        except Exception:  # preloading is an optimisation only
            pass
    if any(k.backend == "triton" for k in keys[:1]):
        preload.append("triton")
    if keys:
        # read by ck_core._buildserver when the fork server starts (once per process)
        import json
        os.environ["CK_BUILD_WARM_KEY"] = json.dumps(keys[0].to_dict())
    ctx.set_forkserver_preload(preload)
    return ctx


def _progress(total: int, enabled: Optional[bool]):
    if enabled is None:
        enabled = knobs.get("CK_PROGRESS") and sys.stderr.isatty()
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, unit="kernel", desc="build")


def build_registry(registry, max_workers: Optional[int] = None, progress: Optional[bool] = None,
                   force: bool = False, cache_root: Optional[str] = None) -> BuildReport:
    mgr = registry.mgr
    if cache_root is None:
        knobs.cache_dir()   # a CK_CACHE_DIR naming a file: one ConfigError now, not one per kernel
    t0 = time.perf_counter()
    todo = []
    report = BuildReport()
    for key in registry:
        backend = mgr.backend(key.backend)
        if backend.compile is None:
            report.built[key.name] = {"backend": key.backend, "compiled": False}
            continue
        todo.append(key)   # an unavailable toolchain is the backend's to report (ck still writes sources)
    workers = max(1, min(max_workers or knobs.build_workers(), len(todo) or 1))
    report.workers = workers
    bar = _progress(len(todo), progress)
    dicts = [k.to_dict() for k in todo]
    if workers == 1 or len(todo) <= 1:
        results = (_compile_one(d, cache_root, force) for d in dicts)
        for res in results:
            _collect(report, res, bar)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context(todo),
                                 initializer=_die_with, initargs=(os.getpid(),)) as pool:
            env = _forwarded_env()
            futs = [pool.submit(_compile_one, d, cache_root, force, env) for d in dicts]
            for fut in as_completed(futs):
                _collect(report, fut.result(), bar)
        os.environ.pop("CK_BUILD_WARM_KEY", None)   # the fork server has read it
    if bar is not None:
        bar.close()
    for name, err in report.failed.items():
        log.debug("kernel %s failed to build and was removed: %s", name, err)
        if name in registry:
            registry.remove(registry.get(name))
    if report.failed:   # one line: each error is in report.failed (ck build prints them once)
        log.warning("%d of %d kernels failed to build and were removed from registry %r (BuildReport.failed "
                    "holds each error)", len(report.failed), len(todo), registry.name)
    for name, meta in report.built.items():
        registry.build_info[name] = meta
    report.seconds = time.perf_counter() - t0
    return report


def _collect(report: BuildReport, res, bar) -> None:
    name, meta, err = res
    if err is not None:
        report.failed[name] = err
    else:
        report.built[name] = meta
        if meta.get("cache_hit"):
            report.cache_hits += 1
    if bar is not None:
        bar.update(1)
