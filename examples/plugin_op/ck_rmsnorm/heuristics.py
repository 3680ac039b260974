"""The first pick among the candidates: no padding when the row length allows, then the widest step
that does not overshoot the row, then the most rows per program that still leaves work for every
compute unit (an arch fact from the ArchSpec, never a constant here)."""
from __future__ import annotations


def heuristic(problem, candidates, arch) -> list:
    def cost(key):
        a = key.algorithm
        overshoot = max(0, a.block_cols - problem.cols)
        programs = -(-problem.rows // a.block_rows)
        idle = max(0, arch.compute_units - programs)
        return (a.pad, overshoot, -a.block_cols, idle, -a.block_rows, key.name)

    return sorted(candidates, key=cost)
