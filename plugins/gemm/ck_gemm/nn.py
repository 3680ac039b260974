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
import types

log = logging.getLogger(__name__)

_MARK = "_ck_gemm_patched"


def _linear_forward(self, x):
    from .api import linear

    return linear(x, self.weight, self.bias)


def patch(model, *, skip=()) -> int:
    """Send the forward of every ``nn.Linear`` in ``model`` (the model itself included) through
    ``ck_gemm.linear``; returns how many modules now do.  Idempotent."""
    import torch.nn as nn

    n = 0
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or name in skip:
            continue
        if getattr(m, _MARK, False):
            n += 1
            continue
        if type(m).forward is not nn.Linear.forward:
            log.debug("ck_gemm.patch: %s (%s) has its own forward; left on it", name, type(m).__name__)
            continue
        m.forward = types.MethodType(_linear_forward, m)
        setattr(m, _MARK, True)
        n += 1
    return n


def unpatch(model) -> int:
    """Undo :func:`patch` on ``model``; returns how many modules went back to torch's forward."""
    n = 0
    for m in model.modules():
        if getattr(m, _MARK, False):
            del m.forward
            delattr(m, _MARK)
            n += 1
    return n
