"""Hook implementations of the grouped-conv op plugin (entry point group ``ck_core.ops``).

A conv KernelKey is ``KernelKey("conv", ConvSignature, ConvAlgorithm, arch, backend)``
(:mod:`ck_conv.keys`; the space in :mod:`ck_conv.space`, the ranking in
:mod:`ck_conv.heuristics`, the triton side in :mod:`ck_conv.backends.triton.keys`); its body is
:attr:`ck_conv.keys.ConvKernelConfig.name`, e.g.
``conv_fwd_fp16_nhwgc_gkyxc_nhwgk_2d_compv3_intrawave_128x128x32_2x2x1_32x32x16_default``.

Tensors by name: inputs ``x`` (input), ``w`` (weight), ``dy`` (output
gradient); outputs ``y`` (forward), ``dx`` (bwd_data), ``dw`` (bwd_weight).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ck_core.dtypes import ATOL, RTOL, quantize
from ck_core.errors import UnsupportedProblem
from ck_core.hookspecs import hookimpl
from ck_core.records import OpSpec

from .heuristics import heuristic, shortlist
from .keys import format_name, from_fields, legal, parse_name, supports
from .problem import IN_NAMES, OUT_NAME, ConvProblem
from .keyspace import enumerate_keys, key_space


# -- references and inputs -------------------------------------------------------

def reference(problem: ConvProblem, tensors: dict) -> dict:
    from .reference import reference as ref
    ops = {n: np.asarray(tensors[n]) for n in IN_NAMES[problem.direction]}
    return {OUT_NAME[problem.direction]: ref(problem, ops)}


def make_inputs(problem: ConvProblem, rng: np.random.Generator) -> dict:
    shapes = {"x": problem.input_shape, "w": problem.weight_shape, "dy": problem.output_shape}
    out = {}
    for n in IN_NAMES[problem.direction]:
        scale = 1.0 / math.sqrt(problem.c_per_group * problem.taps) if n == "w" else 1.0
        out[n] = quantize(rng.uniform(-1.0, 1.0, shapes[n]) * scale, problem.dtype)
    return out


def tolerance(problem: ConvProblem) -> dict:
    # long reductions in fp16/bf16 round more than one GEMM step: widen with the depth
    m, n, k = problem.gemm_mnk
    grow = max(1.0, math.sqrt(k / 256.0))
    name = OUT_NAME[problem.direction]
    return {name: (RTOL[problem.dtype] * grow, ATOL[problem.dtype] * grow)}


def _numpy_impl(key, problem, tensors):
    if supports(key, problem):
        raise UnsupportedProblem(f"{key.name} cannot run {problem}: {supports(key, problem)}")
    out = reference(problem, tensors)
    return {k: quantize(v, problem.dtype) for k, v in out.items()}


def implement(key, backend: str, arch):
    if backend == "numpy":
        return lambda problem, tensors: _numpy_impl(key, problem, tensors)
    if backend == "triton":
        from .backends.triton.keys import make_launcher

        return make_launcher(key, arch)
    raise UnsupportedProblem(f"the conv plugin has no {backend!r} implementation; use backend numpy or triton")


def render(key, backend: str):
    from .backends.triton.keys import render as _render

    return _render(key, backend)


def _flops(p):
    return float(p.flops)


def _bytes(p):
    from ck_core.dtypes import ELEMENT_BYTES
    n = math.prod(p.input_shape) + math.prod(p.weight_shape) + math.prod(p.output_shape)
    return float(n * ELEMENT_BYTES[p.dtype])


def _working_bytes(p, backend):
    """The numpy backend's float64 working set beyond the tensors: the padded input, the weight,
    the output or gradient, the einsum temporary and the copy back into the problem's layout."""
    if backend != "numpy":
        return 0.0
    padded = p.N * p.C * math.prod(i + lo + hi for i, lo, hi in zip(p.input_spatial, p.pad_left, p.pad_right))
    result = {"forward": p.output_shape, "bwd_data": p.input_shape, "bwd_weight": p.weight_shape}[p.direction]
    return 8.0 * (padded + math.prod(p.weight_shape) + math.prod(p.output_shape) + 2 * math.prod(result))


def _features(problem, candidates, arch):
    from .features import features

    return features(problem, candidates, arch)


def _bench(peer, options):
    if options.get("suite", "core") == "broad":
        from .bench_broad import bench
    else:
        from .bench import bench

    return bench(peer, options)


def problem_options(p) -> dict:
    """The part of the space that can run ``p`` (as the torch API narrows it)."""
    return {"directions": (p.direction,), "dtypes": (p.dtype,), "ndims": (p.ndim,), "layouts": (p.layout_family,)}


def conv_op() -> OpSpec:
    return OpSpec(
        name="conv",
        problem_type=ConvProblem,
        tuning_data=str(Path(__file__).resolve().parent / "tuned"),
        enumerate=enumerate_keys,
        key_space=key_space,
        shortlist=shortlist,
        format_name=format_name,
        parse_name=parse_name,
        from_fields=from_fields,
        legal=legal,
        supports=supports,
        reference=reference,
        make_inputs=make_inputs,
        implement=implement,
        input_names=("x", "w", "dy"),
        output_names=("y", "dx", "dw"),
        flops=_flops,
        bytes_moved=_bytes,
        working_bytes=_working_bytes,
        heuristic=heuristic,
        features=_features,
        render=render,
        bench=_bench,
        problem_options=problem_options,
        tolerance=tolerance,
        families=("implicit_gemm", "depthwise"),
        options={
            "directions": "forward, bwd_data, bwd_weight (default: all three)",
            "dtypes": "fp16, bf16, fp32 (default: those the arch runs)",
            "ndims": "spatial ranks 1, 2, 3 (default: all)",
            "layouts": "nhwgc, ngchw, gnhwc (default nhwgc)",
            "specializations": "CK's conv specialisations (default, filter1x1 ...) (default: all)",
            "pipelines": "mem, compv3, compv4 (default: the arch's)",
            "tiles": "block tiles as M,N,K triples (default: CK's table)",
            "split_ks": "reduction splits of the split-reduction kernels, e.g. 1,2,4 (default: per kind)",
        },
        description="grouped convolution 1D/2D/3D: forward, bwd_data, bwd_weight (CK layouts NHWGC/GKYXC/NHWGK)",
    )


@hookimpl
def ck_register_ops():
    return [conv_op()]


@hookimpl
def ck_sweep_spec(op):
    if op.name == "conv":
        from .sweep import sweep_spec

        return sweep_spec()
    return None
