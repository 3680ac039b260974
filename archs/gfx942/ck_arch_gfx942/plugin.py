"""ck-arch-gfx942: registers the ``gfx942`` ArchSpec (entry point group ``ck_core.archs``)."""
from __future__ import annotations

from ck_core import ArchSpec, hookimpl

from .ck_rules import make_gemm_rule
from .facts import FACTS


def arch_spec() -> ArchSpec:
    """The gfx942 record: :data:`.facts.FACTS` plus CK's warp-size-dependent GEMM rules."""
    return ArchSpec(vendor="amd", rules=(make_gemm_rule(FACTS["name"], FACTS["warp_size"]),), **FACTS)


@hookimpl
def ck_register_archs():
    return [arch_spec()]
