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
