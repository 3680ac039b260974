"""ck_core.memory: problems too large for where their tensors would live are refused up front."""
from types import SimpleNamespace

import numpy as np
import pytest

from ck_core import memory
from ck_core.errors import UnsupportedProblem


def test_host_limit_for_numpy_tensors():
    limit, what = memory.limit_for(np.zeros(1))
    assert "host" in what and limit and limit > 1 << 20
    memory.check_fits("small", 1 << 20, np.zeros(1), "numpy")
    with pytest.raises(UnsupportedProblem, match="available host memory"):
        memory.check_fits("huge", limit * 4, np.zeros(1), "numpy")


def test_device_limit_for_gpu_tensors(monkeypatch):
    monkeypatch.setattr(memory, "device_total_bytes", lambda dev: 1 << 30)
    gpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    limit, what = memory.limit_for(gpu)
    assert limit == 1 << 30 and "memory" in what
    memory.check_fits("fits", (1 << 30) - 1, gpu, "triton")
    with pytest.raises(UnsupportedProblem, match=r"needs 2\.0 GiB.*\(1\.0 GiB\)"):
        memory.check_fits("too big", 2 << 30, gpu, "triton")


def test_unknown_sizes_are_not_refused(monkeypatch):
    monkeypatch.setattr(memory, "host_available_bytes", lambda: None)
    memory.check_fits("anything", 1 << 60, np.zeros(1), "numpy")
    memory.check_fits("no size", None, np.zeros(1), "numpy")


def test_numpy_backend_counts_its_working_copies(monkeypatch):
    """GEMM and conv problems whose tensors fit but whose numpy float64 working set does not are
    refused on numpy (the message says so) and pass the check where kernels need only the tensors."""
    from ck_conv import ConvProblem
    from ck_core import Dispatcher, Registry
    from ck_core.plugins import get_manager
    from ck_gemm import GemmProblem

    monkeypatch.setattr(memory, "host_available_bytes", lambda: 4 << 30)
    gemm = GemmProblem(m=16384, n=16384, k=16384, dtype="fp16", layout="rcr")        # 1.5 GiB of tensors
    conv = ConvProblem(N=128, G=1, C=64, K=64, input_spatial=(128, 128), filter=(3, 3), pad_left=(1, 1),
                       pad_right=(1, 1), dtype="fp16")                                # 1 GiB of tensors
    for op, p, opts in (("gemm", gemm, dict(dtypes=["fp16"], layouts=["rcr"])),
                        ("conv", conv, dict(directions=["forward"], dtypes=["fp16"], ndims=[2]))):
        reg = Registry.from_enumeration(op, "gfx942", "numpy", **opts)
        with pytest.raises(UnsupportedProblem, match="working copies"):
            Dispatcher(reg, backend="numpy").plan(p)
        spec = get_manager().op(op)
        assert spec.bytes_moved(p) < 4 << 30 < spec.bytes_moved(p) + spec.working_bytes(p, "numpy")
        assert spec.working_bytes(p, "triton") == 0
