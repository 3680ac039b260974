"""The FMHA helper kernels that belong to no key (group-mode offset guard, NaN poisoning, dropout
random values, the V transpose, the page-table guard) launch through the kernel cache as entries
``fmha/<kernel>``, like the keys' kernels: a prebuilt set (``ck build``, benchmarks/fa_trace.py
--build) holds them and a user's call compiles nothing.  Before, they were plain ``fn[grid]`` JIT
launches: compiled on the user's path, outside any set, and not counted by
``triton_artifacts.STATS`` (FlashAttention's suite: 16 of the first 66 compiles).  On the CPU: the
cache's launch is replaced by a recorder that runs the kernel in the interpreter."""
import pytest
import torch

pytest.importorskip("triton")


@pytest.fixture
def launched(monkeypatch):
    from ck_core.backends import triton_artifacts as ta

    names = []

    def launch(name, fn, grid, args, kwargs, cache_root=None, extra=None):
        names.append(name)
        return fn[grid](*args, **kwargs)   # (TRITON_INTERPRET=1 in the tests: runs on the CPU)

    monkeypatch.setattr(ta, "launch", launch)
    return names


def test_dropout_randval_and_offset_guard_launch_through_the_cache(launched):
    from ck_fmha.backends.triton import guards
    from ck_fmha.backends.triton import launch as ops

    rv = ops.dropout_randval(1, 2, 5, 7, dropout_p=0.3, seed=11, device="cpu")
    assert rv.shape == (1, 2, 5, 7) and rv.dtype == torch.uint8
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    safe, bad = guards.guard_offsets(cu, 9, 6)
    assert safe.tolist() == [0, 3, 9]
    x = torch.zeros(10)
    guards.poison(bad, x)
    assert not torch.isnan(x).any()
    assert launched[:2] == ["fmha/fmha_dropout_randval_kernel", "fmha/_offset_guard_kernel"], launched
    assert all(n.startswith("fmha/") for n in launched), launched
