"""ck-arch-gfx90a: AMD Instinct MI250X, one GCD (CDNA2) for ck-dispatcher.

Installed with pip, it registers the ``gfx90a`` arch through the ``ck_core.archs``
entry point; nothing in ck-core names it.
"""
from __future__ import annotations

from .plugin import arch_spec

__all__ = ["arch_spec"]
