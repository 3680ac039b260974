"""Which installed arch plugin a tensor's device is.

A GPU is matched to an arch plugin by its Triton target: ``("cuda", 90)`` for
compute capability (9, 0), ``("hip", "gfx942")`` on ROCm.  The arch facts an op
needs (compute units, shared memory) are then read from that plugin's
ArchSpec.  CPU tensors run "as if" on one arch's kernel space (the numpy
backend, or the Triton interpreter): ``CK_CPU_ARCH``, by default gfx942.
"""
from __future__ import annotations

import functools
from typing import Optional

from . import knobs
from .errors import UnsupportedProblem
from .plugins import PluginManager, get_manager
from .records import ArchSpec

#: the CPU's stand-in arch when CK_CPU_ARCH is unset and it is installed
DEFAULT_CPU_ARCH = "gfx942"


@functools.lru_cache(maxsize=None)
def _gpu_target(index: int) -> tuple:
    import torch

    if getattr(torch.version, "hip", None):
        return ("hip", torch.cuda.get_device_properties(index).gcnArchName.split(":")[0])
    major, minor = torch.cuda.get_device_capability(index)
    return ("cuda", major * 10 + minor)


def device_target(device) -> Optional[tuple]:
    """``(triton backend, arch)`` of a torch device; None for the CPU."""
    kind = getattr(device, "type", str(device))
    if kind == "cpu":
        return None
    if kind != "cuda":
        raise UnsupportedProblem(f"tensors on a {kind!r} device are not supported; move them to a "
                                 f"CUDA/ROCm GPU or to the CPU")
    import torch

    index = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
    return _gpu_target(index)


def arch_for_target(target: tuple, manager: Optional[PluginManager] = None) -> ArchSpec:
    """The installed arch plugin whose Triton target is ``target``."""
    mgr = manager or get_manager()
    for arch in mgr.archs().values():
        if arch.triton_target is not None and tuple(arch.triton_target[:2]) == tuple(target):
            return arch
    backend, name = target
    wanted = f"sm{name}" if backend == "cuda" else str(name)
    known = ", ".join(f"{a.name} ({a.triton_target[0]}:{a.triton_target[1]})"
                      for a in mgr.archs().values() if a.triton_target) or "none"
    raise UnsupportedProblem(f"no installed arch plugin targets this GPU ({backend}:{name}); install one "
                             f"(e.g. pip install ck-arch-{wanted}); installed: {known}")


def cpu_arch(manager: Optional[PluginManager] = None) -> ArchSpec:
    """The arch whose kernel space CPU tensors dispatch in."""
    mgr = manager or get_manager()
    name = knobs.get("CK_CPU_ARCH")
    if name:
        return mgr.arch(name)
    archs = mgr.archs()
    if not archs:
        raise UnsupportedProblem("no arch plugin is installed; install one (e.g. pip install ck-arch-gfx942)")
    return archs.get(DEFAULT_CPU_ARCH) or archs[sorted(archs)[0]]


def current_arch(tensor, manager: Optional[PluginManager] = None) -> ArchSpec:
    """The ArchSpec of the device ``tensor`` lives on (a tensor or a torch device)."""
    device = getattr(tensor, "device", tensor)
    target = device_target(device)
    if target is None:
        return cpu_arch(manager)
    return arch_for_target(target, manager)
