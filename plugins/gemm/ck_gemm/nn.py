"""Route a torch model's ``nn.Linear`` layers through :func:`ck_gemm.linear`.

    import ck_gemm
    n = ck_gemm.patch(model)      # every nn.Linear, in place
    ...
    ck_gemm.unpatch(model)        # back to torch's forward

A patched module keeps its parameters, hooks, ``state_dict`` and autograd (the public API's
backward); only its ``forward`` changes, as an instance attribute over the class's method.
``nn.Linear`` subclasses with a ``forward`` of their own (LoRA-style wrappers, quantised layers)
stay on it.  ``skip``: module names (as ``named_modules`` gives them) to leave alone, e.g. a
language model's ``lm_head``.
"""
from __future__ import annotations

import logging

from ck_core.patching import has_own_forward, patch_modules, unpatch_modules

log = logging.getLogger(__name__)

_MARK = "_ck_gemm_patched"


def _linear_forward(self, x):
    from .api import linear

    return linear(x, self.weight, self.bias)


def patch(model, *, skip=()) -> int:
    """Send the forward of every ``nn.Linear`` in ``model`` (the model itself included) through
    ``ck_gemm.linear``; returns how many modules now do.  Idempotent."""
    import torch.nn as nn

    def route(name, m):
        if not isinstance(m, nn.Linear):
            return None
        if has_own_forward(m, nn.Linear):
            log.debug("ck_gemm.patch: %s (%s) has its own forward; left on it", name, type(m).__name__)
            return None
        return _linear_forward

    return patch_modules(model, _MARK, route, skip=skip)


def unpatch(model) -> int:
    """Undo :func:`patch` on ``model``; returns how many modules went back to torch's forward."""
    return unpatch_modules(model, _MARK)
