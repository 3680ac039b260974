"""ck-arch-sm90: registers the ``sm90`` ArchSpec (entry point group ``ck_core.archs``)."""
from __future__ import annotations

from ck_core import ArchSpec, hookimpl

from .facts import FACTS
from .rules import RULES


def arch_spec() -> ArchSpec:
    """The sm90 record: :data:`.facts.FACTS` plus Hopper's GEMM rules."""
    return ArchSpec(vendor="nvidia", rules=RULES, **FACTS)


@hookimpl
def ck_register_archs():
    return [arch_spec()]
