"""What the op plugins' torch APIs share: one Dispatcher per (device arch, backend).

A public call (a torch entry point of an op plugin, such as matmul or conv2d) builds its Problem
from the tensors and runs it through :func:`dispatcher_on` the tensors' device.
The registry of each Dispatcher is built once, lazily: the ``ck_api_registry``
hook when a plugin answers, else the op's enumeration with ``OpSpec.api_options``.
The Dispatchers read the tuned-data store's measured winners (``ck tune``'s) first, so tuning
improves what users call.  A Dispatcher caches problem -> plan, so a warm call is
a few dict lookups and the launches.
"""
from __future__ import annotations

import logging
from typing import Optional

from . import knobs
from .device import current_arch
from .dispatcher import Dispatcher
from .errors import InvalidProblem
from .plugins import PluginManager, get_manager
from .records import ArchSpec
from .registry import Registry

log = logging.getLogger(__name__)

_DISPATCHERS: dict = {}
_ON_DEVICE: dict = {}
_TUNING: list = []

#: torch dtype name -> ck dtype token
_TOKENS = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "fp8",
           "float8_e5m2": "bf8", "int8": "int8", "int32": "int32"}


_BY_DTYPE: dict = {}


def dtype_token(dtype) -> str:
    """The ck dtype token (``"fp16"`` ...) of a torch dtype."""
    token = _BY_DTYPE.get(dtype)
    if token is None:
        name = str(dtype).replace("torch.", "")
        if name not in _TOKENS:
            raise InvalidProblem(f"torch.{name} is not a kernel dtype; cast the tensors to one of "
                                 f"{', '.join('torch.' + n for n in _TOKENS)}")
        token = _BY_DTYPE[dtype] = _TOKENS[name]
    return token


from .dtypes import torch_dtype  # noqa: E402,F401  (one copy: ck_core.dtypes)


def _frozen(options: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def dispatcher_for(op: str, arch, backend: str, manager: Optional[PluginManager] = None,
                   **options) -> Dispatcher:
    """The Dispatcher the public API of ``op`` uses on ``arch`` (ArchSpec or name) with ``backend``.

    ``options`` narrow the enumeration (over ``OpSpec.api_options``) to one
    signature family, e.g. a dtype and layout: each family's registry is
    enumerated once, on its first call, and stays small to rank.
    """
    mgr = manager or get_manager()
    name = arch.name if isinstance(arch, ArchSpec) else arch
    key = (mgr, op, name, backend, _frozen(options))
    disp = _DISPATCHERS.get(key)
    if disp is None:
        spec = mgr.arch(name)
        opts = {**dict(mgr.op(op).api_options), **options}
        reg = mgr.hook.ck_api_registry(op=op, arch=spec, backend=backend, options=opts)
        if reg is None:
            reg = Registry.from_enumeration(op, name, backend, manager=mgr, **opts)
        log.debug("public %s API on %s/%s %s: registry %r", op, name, backend, opts, reg.name)
        disp = _DISPATCHERS[key] = Dispatcher(reg, backend=backend, tuning=_tuning_table())
    return disp


def _tuning_table():
    """``ck tune``'s measured winners (the tuned-data store), opened once per process."""
    if not _TUNING:
        from .winners import Winners

        _TUNING.append(Winners())
    return _TUNING[0]


def backend_for(device) -> str:
    """``CK_BACKEND`` when set; triton on a GPU and under ``TRITON_INTERPRET=1``; else numpy."""
    explicit = knobs.get("CK_BACKEND")
    if explicit:
        return explicit
    if getattr(device, "type", str(device)) != "cpu":
        return "triton"
    from .backends import triton_backend

    if triton_backend.interpreting() and triton_backend.available()[0]:
        return "triton"
    return "numpy"


def dispatcher_on(op: str, tensor, **options) -> Dispatcher:
    """The Dispatcher for ``op`` (and ``options``, see :func:`dispatcher_for`) on ``tensor``'s device.

    The hot path: one dict lookup once warm.  The arch and backend of a device
    (``CK_BACKEND``, ``CK_CPU_ARCH``, ``TRITON_INTERPRET``) are decided on its
    first call; after changing them in a running process, call :func:`clear`.
    """
    key = (get_manager(), op, tensor.device, *options.values())
    disp = _ON_DEVICE.get(key)
    if disp is None:
        disp = _ON_DEVICE[key] = dispatcher_for(op, current_arch(tensor), backend_for(tensor.device), **options)
    return disp


def run(disp: Dispatcher, problem, tensors: dict, *, device, dtype):
    """Run ``problem`` on torch ``tensors``; the single output as a torch tensor on ``device``.

    The numpy backend gets numpy arrays (and its result comes back as a tensor).
    """
    import numpy as np
    import torch

    if disp.backend == "numpy":
        # numpy has no bf16/fp8: those travel as float32 (their numpy storage)
        tensors = {k: _numpy(v) for k, v in tensors.items()}
    out = disp.run(problem, **tensors)
    if not isinstance(out, torch.Tensor):
        out = torch.from_numpy(np.ascontiguousarray(out))
    return out.to(device=device, dtype=dtype)


def _numpy(t):
    import torch

    t = t.detach().cpu()
    if t.is_floating_point() and (t.dtype == torch.bfloat16 or t.element_size() == 1):
        t = t.float()
    return t.numpy()


_ON_CLEAR: list = []


def on_clear(fn) -> None:
    """Call ``fn()`` from :func:`clear`: for an op plugin's own caches of Dispatchers or problems."""
    if fn not in _ON_CLEAR:
        _ON_CLEAR.append(fn)


def clear() -> None:
    """Forget every public-API Dispatcher, warm-call closure and the loaded tuned data (tests;
    after installing a plugin, changing CK_BACKEND / CK_CPU_ARCH, or tuning)."""
    from . import warm
    from .tuned_data import clear_cache

    warm.clear()
    _DISPATCHERS.clear()
    _ON_DEVICE.clear()
    _TUNING.clear()
    clear_cache()
    for fn in _ON_CLEAR:
        fn()
