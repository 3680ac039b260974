"""Warm batch_prefill calls (issue #26): a known signature replays the recorded launches (the kernel,
which checks the query offsets itself; the page check) with each call's tensors, for both page-table forms (vLLM's
block_table, SGLang's kv_indptr + kv_page_indices).  The recorded launches run in the Triton interpreter
with each call's arguments; every call draws fresh data (queries, lengths, page order) and is checked
against a float64 reference written from the math; the previous output is poisoned first."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = [pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="CPU tensors run triton kernels only in the interpreter"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

from ck_core import api as core  # noqa: E402
from ck_core import warm  # noqa: E402
from ck_core.testing import interp_replays  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402
from ck_fmha.prefill import batch_prefill  # noqa: E402


@pytest.fixture
def replays(monkeypatch):
    monkeypatch.setenv("CK_BACKEND", "triton")
    core.clear()
    yield interp_replays(monkeypatch)
    core.clear()


def _ref(q, k, v, cu, lens):
    """float64 [total_q, H, D]: each sequence's queries over its first lens[b] keys (k/v [B, Hk, S, D])."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    h, hk, d = q.shape[1], k.shape[1], q.shape[2]
    for b in range(len(lens)):
        qs = q[cu[b]:cu[b + 1]].double().transpose(0, 1)                       # [H, n, D]
        kk = k[b, :, :lens[b]].double().repeat_interleave(h // hk, 0)
        vv = v[b, :, :lens[b]].double().repeat_interleave(h // hk, 0)
        out[cu[b]:cu[b + 1]] = (torch.softmax(qs @ kk.transpose(-1, -2) * d ** -0.5, -1) @ vv).transpose(0, 1)
    return out


@pytest.mark.parametrize("form", ["block_table", "indptr"])
def test_batch_prefill_warm_calls(replays, monkeypatch, form):
    g = torch.Generator().manual_seed(13 if form == "block_table" else 14)
    b, h, hk, d, ps, cap = 2, 4, 2, 32, 8, 40
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)   # query lengths 5 and 7 (packed: 12 rows)
    npg = cap // ps
    built, real = [], FmhaProblem.__init__
    before, last = warm.size(), None
    for step, lens in enumerate([[40, 17], [9, 33], [23, 23]]):
        if step == 1:
            def counted(self, *a, **kw):
                built.append(1)
                real(self, *a, **kw)

            monkeypatch.setattr(FmhaProblem, "__init__", counted)
        if last is not None:
            last.fill_(float("nan"))
        q = torch.randn(12, h, d, generator=g).half()
        k, v = (torch.randn(b, hk, cap, d, generator=g).half() for _ in range(2))
        order = torch.randperm(b * npg + 3, generator=g)[:b * npg].to(torch.int32).view(b, npg)
        kc = torch.full((b * npg + 3, ps, hk, d), float("nan")).half()
        vc = kc.clone()
        for bi in range(b):
            for pi in range(npg):
                kc[order[bi, pi]] = k[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
                vc[order[bi, pi]] = v[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
        seqlens = torch.tensor(lens, dtype=torch.int32)
        if form == "block_table":
            tables = dict(block_table=order)
        else:
            tables = dict(kv_indptr=torch.tensor([0, npg, 2 * npg], dtype=torch.int32),
                          kv_page_indices=order.reshape(-1).clone())
        o = batch_prefill(q, kc, vc, seqlens, cu_seqlens_q=cu, max_seqlen_q=7, max_seqlen_k=cap, **tables)
        ref = _ref(q, k, v, cu.tolist(), lens)
        assert ((o.double() - ref).norm() / ref.norm()) < 3e-3, (step, lens)
        assert warm.size() == before + 1, "one closure for the signature"
        last = o
    assert not built, "warm calls build no Problem"
    assert max(r.calls for r in replays) >= 2   # the recorded launches ran again
