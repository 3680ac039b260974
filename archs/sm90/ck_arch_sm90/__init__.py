"""ck-arch-sm90: NVIDIA Hopper (H100 SXM) for ck-dispatcher, written as a third party would.

It imports only the public ck-core API (``ArchSpec``, ``hookimpl``); pip
installs it, the ``ck_core.archs`` entry point finds it, and nothing in
ck-core or the op plugins names it.
"""
from __future__ import annotations

from .plugin import arch_spec

__all__ = ["arch_spec"]
