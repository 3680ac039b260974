"""Refuse a problem whose tensors cannot fit before anything is allocated.

A problem too large for the machine otherwise ends in a ``MemoryError`` deep in
numpy, a CUDA out-of-memory error, or the kernel's OOM killer minutes later.
The op's ``bytes_moved(problem)`` gives the bytes of its tensors; the backend's
own ``to_backend`` tells where they would live (a tensor with a CUDA device
lives on the GPU, anything else in host memory).
"""
from __future__ import annotations

import os
from typing import Optional

from .errors import UnsupportedProblem


def host_available_bytes() -> Optional[int]:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), else sysconf."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def device_total_bytes(device) -> Optional[int]:
    """Total memory of a CUDA (or ROCm) torch device: the hard limit, whatever the cache holds."""
    try:
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:  # no torch / no such device: nothing to check against
        return None


def limit_for(sample) -> tuple[Optional[int], str]:
    """(bytes, what) for tensors shaped like ``sample`` (a backend's tensor)."""
    dev = getattr(sample, "device", None)
    if dev is not None and getattr(dev, "type", "cpu") != "cpu":
        return device_total_bytes(dev), f"the {dev} memory"
    return host_available_bytes(), "the available host memory"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_fits(problem, nbytes: Optional[float], sample, backend: str, working: float = 0.0) -> None:
    """Raise UnsupportedProblem when ``nbytes`` of tensors, plus ``working`` bytes the backend
    needs on top (e.g. the numpy backend's float64 copies), exceed the memory ``sample`` lives in."""
    if not nbytes:
        return
    total = nbytes + (working or 0.0)
    limit, what = limit_for(sample)
    if limit is not None and total > limit:
        need = (f"{_gib(total)} ({_gib(nbytes)} for its tensors, {_gib(working)} of {backend} working copies)"
                if working else f"{_gib(nbytes)} for its tensors alone")
        raise UnsupportedProblem(
            f"{problem} needs {need}, more than {what} ({_gib(limit)}) that backend {backend!r} "
            f"would use; make the problem smaller (fewer batches or shorter sizes) or split it")


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False where torch or CUDA is not in use)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    return torch.cuda.is_current_stream_capturing()


def persistent(make, device=None):
    """``make()``, run so that the tensors it allocates belong to no CUDA graph: for buffers a module keeps
    across calls (a device flag, counters, a workspace, tables cached on the device, a sample tensor).

    While a thread captures a CUDA graph, and while ``torch.compile(mode="reduce-overhead")``'s CUDA-graph
    trees run a graph's warm-up, torch routes that thread's allocations into the graph's private memory
    pool; the trees then refuse any tensor alive in the pool but the graph's outputs ("tensor(s) in the
    cudagraph pool not tracked as outputs").  So ``make`` runs in a helper thread (the routing is per
    thread), on ``device`` (a CUDA device; default the current one), its work ordered after the caller's
    stream and the caller's stream after it (stream waits: no host synchronisation).  While the caller's
    stream captures, no other thread may allocate (global capture mode), so ``make`` runs in this thread
    and what it allocates is the graph's (callers that must not allocate then refuse first).  Elsewhere
    (CPU tensors, the numpy backend) the helper thread is harmless: tests track allocations per thread
    (:class:`ck_core.testing.Allocations`).  A one-time cost per buffer: never call this per call.
    """
    import sys
    import threading

    torch = sys.modules.get("torch")
    if torch is None:   # (no torch imported yet: no graph can be under way; the numpy backend pays no import)
        return make()
    dev = None if device is None else torch.device(device)
    cuda = dev.type == "cuda" if dev is not None else torch.cuda.is_initialized()
    caller = None
    if cuda:
        if dev is None or dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        with torch.cuda.device(dev):
            if torch.cuda.is_current_stream_capturing():
                return make()
            caller = torch.cuda.current_stream()
    box: dict = {}

    def work():
        try:
            if caller is None:
                box["out"] = make()
                return
            with torch.cuda.device(dev):
                here = torch.cuda.current_stream()
                here.wait_stream(caller)
                out = make()
                caller.wait_stream(here)
                if here != caller:   # freed later: not before the caller's stream is done with it
                    for t in (out if isinstance(out, (tuple, list)) else (out,)):
                        if isinstance(t, torch.Tensor) and t.is_cuda:
                            t.record_stream(caller)
                box["out"] = out
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            box["err"] = e

    helper = threading.Thread(target=work, name="ck-persistent-buffer", daemon=True)
    helper.start()
    helper.join()
    if "err" in box:
        raise box["err"]
    return box["out"]
