"""ck-arch-gfx1201: AMD Radeon RX 9070 XT (RDNA4) for ck-dispatcher.

Installed with pip, it registers the ``gfx1201`` arch through the ``ck_core.archs``
entry point; nothing in ck-core names it.
"""
from __future__ import annotations

from .plugin import arch_spec

__all__ = ["arch_spec"]
