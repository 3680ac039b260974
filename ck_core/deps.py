"""Optional dependencies: one scheme of extras, and errors that say which one to install.

Every distribution offers the same extras (``pip install 'ck-gemm[torch]'``, ``'ck-core[plot]'``):

=================  ============================================================
``[torch]``        the op plugins' torch functions (matmul, conv2d, attention ...) and the
                   triton backend's launches
``[triton]``       the triton backend (Triton 3.6 and torch)
``[ray]``          ``ck sweep --executor ray``
``[plot]``         ``ck sweep --plot``, ``ck select report`` PNGs (matplotlib)
``[train]``        fitting the learned rankers (``python -m ck_core.select_train``)
``[transformers]`` an op plugin's Hugging Face integration (the attention plugin's
                   ``attn_implementation``)
=================  ============================================================
"""
from __future__ import annotations

import importlib.util

from .errors import MissingDependency

#: top-level module -> the extra that installs it
EXTRAS = {"torch": "torch", "triton": "triton", "ray": "ray", "matplotlib": "plot", "lightgbm": "train",
          "sklearn": "train", "transformers": "transformers", "tqdm": "progress"}


def missing(exc: ImportError, what: str, dist: str = "ck-core") -> BaseException:
    """The error to raise for ``exc`` while importing what ``what`` needs: a
    :class:`MissingDependency` naming ``pip install '<dist>[<extra>]'`` when the missing module
    is an optional dependency, else ``exc`` itself (a bug, not an install question)."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRAS.get(name)
    if extra is None:
        return exc
    err = MissingDependency(f"{what} needs {name}, which is not installed: pip install '{dist}[{extra}]'")
    err.name = name
    return err


def require(module: str, what: str, dist: str = "ck-core") -> None:
    """Fail now, in a second, if ``module`` is not installed (before work that would need it later)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:   # an import hook that refuses the name
        found = False
    if not found:
        raise missing(ModuleNotFoundError(module, name=module), what, dist)
