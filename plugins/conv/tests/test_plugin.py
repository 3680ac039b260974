"""The conv op through the core: registry, names, dispatcher on numpy and triton, AOT render."""
from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from ck_core import Dispatcher, KernelKey, Registry
from ck_core.testing import check_against_reference
from ck_conv.problem import ConvProblem

PROBLEMS = [
    ConvProblem(N=2, G=2, C=8, K=6, input_spatial=(7, 6), filter=(3, 3), stride=(2, 1), pad_left=(1, 1),
                pad_right=(0, 1), dtype="fp32"),
    ConvProblem(N=1, C=6, K=5, input_spatial=(9,), filter=(3,), dilation=(2,), direction="bwd_data"),
    ConvProblem(N=2, C=4, K=4, input_spatial=(3, 4, 5), filter=(1, 1, 1), direction="bwd_weight", dtype="bf16"),
    ConvProblem(N=2, G=6, C=6, K=6, input_spatial=(5, 5), filter=(3, 3), pad_left=1, pad_right=1,
                direction="bwd_weight", split_k=0),
]


def test_entry_point_and_registration(conv_manager):
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "ck-conv"
    assert meta["project"]["entry-points"]["ck_core.ops"] == {"conv": "ck_conv.plugin"}
    assert meta["build-system"]["build-backend"] == "setuptools.build_meta"
    op = conv_manager.op("conv")
    assert op.problem_type is ConvProblem and set(op.input_names) == {"x", "w", "dy"}


def test_registry_names_round_trip(conv_manager, fake_arch):
    reg = Registry.from_enumeration("conv", fake_arch.name, dtypes=["fp16"], ndims=[2], directions=["forward"])
    assert len(reg) > 20
    for k in list(reg)[::17]:
        assert KernelKey.from_name(k.name) == k
        assert KernelKey.from_dict(k.to_dict()) == k
    assert all(k.fields["warp_tile_m"] in (16, 32) for k in reg if k.fields["specialization"] != "depthwise")


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.direction}-{p.ndim}d-{p.dtype}")
def test_numpy_dispatch_validates(conv_manager, fake_arch, problem, ck_rng):
    reg = Registry.from_enumeration("conv", fake_arch.name, dtypes=[problem.dtype], ndims=[problem.ndim],
                                    directions=[problem.direction])
    disp = Dispatcher(reg)
    key = disp.select(problem)
    assert conv_manager.op("conv").supports(key, problem) is None
    report = check_against_reference(disp, problem, ck_rng)
    assert report.passed, str(report)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.direction}-{p.ndim}d-{p.dtype}")
def test_triton_dispatch_validates(conv_manager, fake_arch, problem, ck_rng):
    pytest.importorskip("triton")
    reg = Registry.from_enumeration("conv", fake_arch.name, backend="triton", dtypes=[problem.dtype],
                                    ndims=[problem.ndim], directions=[problem.direction])
    disp = Dispatcher(reg, backend="triton")
    report = check_against_reference(disp, problem, ck_rng)
    assert report.passed, str(report)


def test_dispatcher_run_positional_and_named(conv_manager, fake_arch):
    torch = pytest.importorskip("torch")
    p = PROBLEMS[0]
    disp = Dispatcher(Registry.from_enumeration("conv", fake_arch.name, backend="triton", dtypes=["fp32"],
                                                ndims=[2], directions=["forward"]), backend="triton")
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal(p.input_shape).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal(p.weight_shape).astype(np.float32))
    y = disp.run(p, x, w)
    from ck_conv.reference import conv_fwd, rel_error
    assert rel_error(y.numpy(), conv_fwd(p, x.numpy(), w.numpy())) < 1e-5
    q = p.with_direction("bwd_data")
    disp2 = Dispatcher(Registry.from_enumeration("conv", fake_arch.name, backend="triton", dtypes=["fp32"],
                                                 ndims=[2], directions=["bwd_data"]), backend="triton")
    dy = torch.from_numpy(rng.standard_normal(p.output_shape).astype(np.float32))
    dx = disp2.run(q, w=w, dy=dy)
    assert tuple(dx.shape) == p.input_shape


def test_heuristic_prefers_specialised_kernels(conv_manager, fake_arch):
    p = ConvProblem(N=4, C=64, K=64, input_spatial=(8, 8), filter=(1, 1))
    reg = Registry.from_enumeration("conv", fake_arch.name, dtypes=["fp16"], ndims=[2], directions=["forward"])
    key = Dispatcher(reg).select(p)
    assert key.algorithm.specialization == "filter1x1_stride1_pad0"
    dw = ConvProblem(N=4, G=16, C=16, K=16, input_spatial=(8, 8), filter=(3, 3), pad_left=1, pad_right=1)
    assert Dispatcher(reg).select(dw).algorithm.specialization == "depthwise"
