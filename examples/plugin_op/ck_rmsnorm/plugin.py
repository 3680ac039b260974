"""The RMSNorm op plugin: one OpSpec, registered through ``ck_register_ops`` (entry point group
``ck_core.ops``), plus demo cases for ``ck demo``."""
from __future__ import annotations

from ck_core.errors import UnsupportedProblem
from ck_core.hookspecs import hookimpl
from ck_core.records import DemoCase, OpSpec

from . import heuristics, keys, reference, space
from .problem import RmsNormProblem


def implement(key, backend: str, arch):
    """The launcher of ``key`` on ``backend`` (``arch``: the Dispatcher's ArchSpec, for its facts)."""
    if backend == "numpy":
        from .backends.numpy_impl import launcher

        return launcher(key)
    raise UnsupportedProblem(f"rmsnorm has no {backend!r} implementation; use --backend numpy")


def rmsnorm_op() -> OpSpec:
    return OpSpec(
        name="rmsnorm",
        problem_type=RmsNormProblem,
        enumerate=space.enumerate_keys,
        format_name=keys.format_name,
        parse_name=keys.parse_name,
        from_fields=keys.from_fields,
        legal=space.legal,
        supports=keys.supports,
        reference=reference.reference,
        make_inputs=reference.make_inputs,
        tolerance=reference.tolerance,
        implement=implement,
        heuristic=heuristics.heuristic,
        problem_options=space.problem_options,
        input_names=("x", "w"),
        output_names=("y",),
        flops=lambda p: 4.0 * p.rows * p.cols,
        bytes_moved=lambda p: p.bytes_moved(),
        options=space.OPTIONS,
        families=("rmsnorm",),
        description="RMSNorm over the last axis (the example op of docs/writing-an-op-plugin.md)",
    )


@hookimpl
def ck_register_ops():
    return [rmsnorm_op()]


@hookimpl
def ck_demo_cases():
    return [DemoCase("rmsnorm", RmsNormProblem(rows=37, cols=1000, dtype="bf16"), order=50)]
