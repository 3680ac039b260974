"""Hook implementations of the GEMM op plugin (entry point group ``ck_core.ops``)."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from ck_core.errors import UnsupportedProblem
from ck_core.hookspecs import hookimpl
from ck_core.records import OpSpec

from . import features, heuristics, keys as kernel, reference
from .problem import GemmProblem


def implement(key, backend: str, arch):
    if backend == "numpy":
        return partial(_numpy_impl, key)
    if backend == "triton":
        from ck_core.backends.triton_backend import refuse_interpreted_bf16

        from .backends.triton.keys import make_fast_launcher

        refuse_interpreted_bf16(key.signature.dtype, key.name)
        return make_fast_launcher(key, num_sms=arch.compute_units)
    raise UnsupportedProblem(f"the gemm plugin has no {backend!r} implementation; "
                             f"use backend numpy or triton")


def _bench(peer, options):
    if options.get("suite", "core") == "broad":
        from .bench_broad import bench
    else:
        from .bench import bench

    return bench(peer, options)


def _render(key, backend):
    from .backends.triton.keys import render

    return render(key, backend)


def _numpy_impl(key, problem, tensors):
    return reference.run_numpy(key, problem, tensors)


def problem_options(p) -> dict:
    """The part of the space that can run ``p`` (``supports`` matches these signature fields)."""
    return {"dtypes": (p.dtype,), "layouts": (p.layout,), "dtypes_c": (p.dtype_c,), "num_ds": (p.num_d,),
            "d_ops": (p.d_op,), "activations": (p.activation,)}


def gemm_op() -> OpSpec:
    return OpSpec(
        name="gemm",
        problem_type=GemmProblem,
        tuning_data=str(Path(__file__).resolve().parent / "tuned"),
        enumerate=heuristics.enumerate_keys,
        format_name=kernel.format_name,
        parse_name=kernel.parse_name,
        from_fields=kernel.from_fields,
        legal=heuristics.legal,
        supports=kernel.supports,
        supports_many=kernel.supports_many,
        reference=reference.reference,
        make_inputs=reference.make_inputs,
        implement=implement,
        input_names=("a", "b", "d0", "d1", "d2", "d3"),
        output_names=("c",),
        flops=lambda p: p.flops(),
        bytes_moved=lambda p: p.bytes_moved(),
        working_bytes=reference.working_bytes,
        heuristic=heuristics.heuristic,
        features=features.features,
        render=_render,
        tolerance=reference.tolerance,
        bench=_bench,
        problem_options=problem_options,
        families=("gemm",),
        options={
            "dtypes": "input dtypes, e.g. fp16,bf16 (default: all the arch runs)",
            "layouts": "CK layout letters of A, B, C: rcr, rrr, crr, ccr (default: all four)",
            "tiles_mn": "block tile sizes for M and N, e.g. 128,256 (default: the arch's)",
            "pipelines": "mem, compv3, compv4 (AMD) or multistage (NVIDIA) (default: the arch's)",
            "epilogues": "cshuffle, default",
            "pads": "padding variants (default: none and all of M, N, K)",
            "num_ds": "fused D tensors per kernel, e.g. 0,1,2 (multi-D epilogue; default 0)",
            "d_ops": "how D tensors combine with the accumulator: add, mul (default add)",
            "activations": "epilogue activations: none, relu, gelu, silu, sigmoid, tanh (default none)",
            "split_ks": "split-K factors, e.g. 1,2,4 (default 1)",
            "dtypes_c": "C (output) dtypes, e.g. fp32 (default: CK's C dtype for the input dtype)",
            "variants": "CK's kernel sets: standard, preshuffle (B pre-shuffled in the kernel's tile order), "
                        "multi_d (fused D tensors), e.g. --variants standard preshuffle multi_d (default standard)",
        },
        description="GEMM: C = act(A @ B op D...), CK layouts rcr/rrr/crr/ccr, batched, split-K, pre-shuffled B",
    )


@hookimpl
def ck_register_ops():
    return [gemm_op()]


@hookimpl
def ck_demo_cases():
    from ck_core.records import DemoCase

    return [DemoCase("gemm", GemmProblem(m=257, n=131, k=199, dtype="fp16", layout="rcr"), order=0)]


@hookimpl
def ck_sweep_spec(op):
    if op.name == "gemm":
        from .sweep import sweep_spec

        return sweep_spec()
    return None
