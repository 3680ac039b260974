"""Hook implementations of the GEMM op plugin (entry point group ``ck_core.ops``)."""
from __future__ import annotations

from functools import partial

from ck_core.errors import UnsupportedProblem
from ck_core.hookspecs import hookimpl
from ck_core.records import OpSpec

from . import kernel, reference
from .problem import GemmProblem


def implement(key, backend: str):
    if backend == "numpy":
        return partial(_numpy_impl, key)
    if backend == "triton":
        from .triton_launch import make_fast_launcher

        return make_fast_launcher(key)
    raise UnsupportedProblem(f"the gemm plugin has no {backend!r} implementation; "
                             f"use backend numpy or triton")


def _bench(peer, options):
    if options.get("suite", "core") == "broad":
        from .bench_broad import bench
    else:
        from .bench import bench

    return bench(peer, options)


def _render(key, backend):
    from .triton_launch import render

    return render(key, backend)


def _numpy_impl(key, problem, tensors):
    return reference.run_numpy(key, problem, tensors)


def gemm_op() -> OpSpec:
    return OpSpec(
        name="gemm",
        problem_type=GemmProblem,
        enumerate=kernel.enumerate_keys,
        format_name=kernel.format_name,
        parse_name=kernel.parse_name,
        from_fields=kernel.from_fields,
        supports=kernel.supports,
        reference=reference.reference,
        make_inputs=reference.make_inputs,
        implement=implement,
        input_names=("a", "b", "d0", "d1", "d2", "d3"),
        output_names=("c",),
        flops=lambda p: p.flops(),
        bytes_moved=lambda p: p.bytes_moved(),
        heuristic=kernel.heuristic,
        render=_render,
        tolerance=reference.tolerance,
        bench=_bench,
        families=("gemm",),
        description="GEMM: C = act(A @ B op D...), CK layouts rcr/rrr/crr/ccr, batched, split-K",
    )


@hookimpl
def ck_register_ops():
    return [gemm_op()]
