"""Route a torch model's convolutions through :func:`ck_conv.conv2d` (and conv1d / conv3d).

    import ck_conv
    n = ck_conv.patch(model)      # every nn.Conv1d/2d/3d the kernels take, in place
    ...
    ck_conv.unpatch(model)        # back to torch's forward

A patched module keeps its parameters, hooks, ``state_dict`` and autograd (the public API's
backward); only its ``forward`` changes, as an instance attribute over the class's method.
Modules the public API does not take stay on torch's forward and are named in a debug log line:
a padding mode other than zeros, a string ``padding="same"`` that is not symmetric, or an
``nn.Conv*`` subclass with its own ``forward`` (LoRA-style wrappers, quantised layers).
"""
from __future__ import annotations

import logging

from ck_core.patching import has_own_forward, patch_modules, unpatch_modules

log = logging.getLogger(__name__)

_MARK = "_ck_conv_patched"


def _padding(m) -> object:
    """The module's padding as the public API takes it (ints), or None for a form it does not."""
    pad = m.padding
    if isinstance(pad, str):
        if pad == "valid":
            return 0
        # "same": symmetric only when dilation * (kernel - 1) is even in every dimension
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size)]
        if any(t % 2 for t in total):
            return None
        return tuple(t // 2 for t in total)
    return pad


def _conv_forward(self, x):
    from . import api

    fn = (api.conv1d, api.conv2d, api.conv3d)[len(self.kernel_size) - 1]
    return fn(x, self.weight, self.bias, self.stride, self._ck_padding, self.dilation, self.groups)


def patch(model, *, dims=(1, 2, 3)) -> int:
    """Send the forward of every ``nn.Conv{d}d`` in ``model`` (``d`` in ``dims``; the model itself
    included) through ``ck_conv.conv{d}d``; returns how many modules now do.  Idempotent."""
    import torch.nn as nn

    classes = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
    kinds = tuple(classes[d] for d in dims)

    def route(name, m):
        if not isinstance(m, kinds):
            return None
        pad = _padding(m)
        if (m.padding_mode != "zeros" or pad is None
                or has_own_forward(m, next(c for c in classes.values() if isinstance(m, c)))):
            log.debug("ck_conv.patch: %s (%s) stays on torch's forward (padding %r, mode %s)",
                      name or type(m).__name__, type(m).__name__, m.padding, m.padding_mode)
            return None
        m._ck_padding = pad
        return _conv_forward

    return patch_modules(model, _MARK, route)


def unpatch(model) -> int:
    """Undo :func:`patch` on ``model``; returns how many modules went back to torch's forward."""
    return unpatch_modules(model, _MARK, extra=("_ck_padding",))
