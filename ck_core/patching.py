"""Send a torch model's layers through an op's torch entry points, and back (``patch`` / ``unpatch``).

The op plugins' ``nn.patch(model)`` (a model's ``nn.Linear`` or ``nn.Conv*d`` layers through the
op's public functions) share this walk: a patched module keeps its parameters, hooks,
``state_dict`` and autograd; only its ``forward`` changes, as an instance attribute over the
class's method, and a per-op marker attribute says so.  The op decides which modules it takes
(``route``); this module names no op.
"""
from __future__ import annotations

import types
from typing import Callable, Iterable, Optional


def has_own_forward(m, base: type) -> bool:
    """Whether ``m``'s class overrides ``base.forward`` (LoRA-style wrappers, quantised layers):
    such modules stay on their own forward."""
    return type(m).forward is not base.forward


def patch_modules(model, mark: str, route: Callable[[str, object], Optional[Callable]], *,
                  skip: Iterable[str] = ()) -> int:
    """For every module of ``model`` (itself included, ``named_modules`` order) whose name is not in
    ``skip``: ``route(name, module)`` gives the forward it should run (a function of ``(self, x)``), or
    None to leave it alone.  The forward is bound as an instance attribute and ``mark`` set; modules
    already marked count without being routed again (idempotent).  Returns how many modules are patched."""
    skip = frozenset(skip)
    n = 0
    for name, m in model.named_modules():
        if name in skip:
            continue
        if getattr(m, mark, False):
            n += 1
            continue
        fwd = route(name, m)
        if fwd is None:
            continue
        m.forward = types.MethodType(fwd, m)
        setattr(m, mark, True)
        n += 1
    return n


def unpatch_modules(model, mark: str, extra: Iterable[str] = ()) -> int:
    """Undo :func:`patch_modules` for ``mark``: the instance ``forward``, the marker and the ``extra``
    attributes the op's route set go; returns how many modules went back to their class's forward."""
    extra = tuple(extra)
    n = 0
    for m in model.modules():
        if getattr(m, mark, False):
            del m.forward
            for a in extra:
                if a in m.__dict__:
                    delattr(m, a)
            delattr(m, mark)
            n += 1
    return n
