"""ck-arch-gfx950: registers the ``gfx950`` ArchSpec (entry point group ``ck_core.archs``)."""
from __future__ import annotations

from ck_core import ArchSpec, hookimpl

from .facts import FACTS


def arch_spec() -> ArchSpec:
    """The gfx950 record: :data:`.facts.FACTS`, pure data (CK's GEMM rules live in the GEMM plugin)."""
    return ArchSpec(vendor="amd", **FACTS)


@hookimpl
def ck_register_archs():
    return [arch_spec()]
