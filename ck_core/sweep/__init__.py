"""The tile engine: ``ck sweep <op>``.

A kernel set (enumeration + seed-format config + filters) crossed with an
op's testing matrix (smoke / full / nightly shapes) is compiled in parallel,
benchmarked and verified through the Dispatcher's launchers, and written as
CSV / JSON / PNG rows, resumably.  Executors: a local process pool
(:mod:`.local`) or a Ray cluster (:mod:`.ray_executor`).
"""
from __future__ import annotations

from .spec import KernelSet, SweepSpec, cast_inputs, generic_kernel_set

__all__ = ["KernelSet", "SweepSpec", "cast_inputs", "generic_kernel_set"]
