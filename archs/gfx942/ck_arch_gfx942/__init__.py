"""ck-arch-gfx942: AMD Instinct MI300X (CDNA3) for ck-dispatcher.

Installed with pip, it registers the ``gfx942`` arch through the ``ck_core.archs``
entry point; nothing in ck-core names it.
"""
from __future__ import annotations

from .plugin import arch_spec

__all__ = ["arch_spec"]
