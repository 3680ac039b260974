"""ck-arch-gfx950: AMD Instinct MI355X (CDNA4) for ck-dispatcher.

Installed with pip, it registers the ``gfx950`` arch through the ``ck_core.archs``
entry point; nothing in ck-core names it.
"""
from __future__ import annotations

from .plugin import arch_spec

__all__ = ["arch_spec"]
