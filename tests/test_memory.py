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
