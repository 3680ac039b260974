"""A D operand that broadcasts along M (linear's bias) reaches the kernel as a stride-0 row, not a
materialised (M, N) copy (issue #26); the results match a float64 reference."""
import pytest
import torch

import ck_gemm
from ck_gemm import api


def test_bias_row_is_a_view():
    bias = torch.randn(13).half()
    d = api._d_operand(bias, torch.float16, (7, 13), (7, 13))
    assert d.stride() == (0, 1) and d.data_ptr() == bias.data_ptr()
    col = api._d_operand(torch.randn(7, 1).half(), torch.float16, (7, 13), (7, 13))
    assert col.is_contiguous()                        # a column broadcast is materialised


@pytest.mark.parametrize("lead", [(37,), (3, 11)])
def test_linear_bias_matches_float64(lead):
    g = torch.Generator().manual_seed(len(lead))
    x = torch.randn(*lead, 40, generator=g).half()
    w, b = torch.randn(24, 40, generator=g).half(), torch.randn(24, generator=g).half()
    want = x.double() @ w.double().t() + b.double()
    for _ in range(2):                                # the cold call, then the warm one
        y = ck_gemm.linear(x, w, b)
        assert y.shape == (*lead, 24)
        assert float((y.double() - want).norm() / want.norm()) < 1e-2
    y = ck_gemm.matmul(x.reshape(-1, 40), w.t(), d=(b, b), activation="relu")
    ref = torch.relu(x.reshape(-1, 40).double() @ w.double().t() + 2 * b.double())
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
