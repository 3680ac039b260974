"""CK FMHA kernel enumeration with CK parity.

``enumerate_kernels(arch, receipt, families)`` lists the kernels CK's
``01_fmha`` code generator emits; each is a frozen :class:`FmhaKernelSpec`
whose ``ck_name`` is CK's kernel name and whose ``name`` is our own stable,
parseable name.  Sweep configs (JSON or TOML allow-lists) narrow the list.
"""
from .ck_facts import ARCHES, FAMILIES, MASK_IMPLS, RECEIPTS
from .enumerate import count_kernels, enumerate_kernels, spec_from_ck_name
from .spec import FmhaKernelSpec, parse_name
from .sweep import SweepConfig, apply_sweep, load_sweep

__all__ = [
    "ARCHES",
    "FAMILIES",
    "MASK_IMPLS",
    "RECEIPTS",
    "FmhaKernelSpec",
    "SweepConfig",
    "apply_sweep",
    "count_kernels",
    "enumerate_kernels",
    "load_sweep",
    "parse_name",
    "spec_from_ck_name",
]
