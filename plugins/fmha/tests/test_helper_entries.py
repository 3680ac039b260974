"""The FMHA helper kernels that belong to no key (dropout random values, the V transpose, the
page-table guard; group-mode offsets need none since the kernels check them) launch through the kernel cache as entries
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


def test_dropout_randval_launches_through_the_cache(launched):
    from ck_fmha.backends.triton import launch as ops

    rv = ops.dropout_randval(1, 2, 5, 7, dropout_p=0.3, seed=11, device="cpu")
    assert rv.shape == (1, 2, 5, 7) and rv.dtype == torch.uint8
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    rv = ops.dropout_randval(2, 2, 6, 6, dropout_p=0.3, seed=11, device="cpu", cu_seqlens_q=cu, cu_seqlens_k=cu,
                             total_q=9)
    assert rv.shape == (2, 9, 6) and int(rv[:, :3, 3:].max()) == 0   # (batch 0: 3 keys)
    assert launched == ["fmha/fmha_dropout_randval_kernel"] * 2, launched
