"""Page indices (block_table / kv_page_indices) outside the page pool: refused on the host for CPU
tensors, only the entries a batch uses (padding past them is allowed); on a GPU, device ops mark the
batch's length -1 (the kernels' bad-length path: NaN outputs, no page read, nothing written), clamp
the table into the pool and set BAD_PAGES in the device flag."""
import os

import pytest
import torch

from ck_core.errors import InvalidProblem
from ck_fmha import device_errors as D


def _i32(*rows):
    return torch.tensor(rows, dtype=torch.int32)


def test_host_check_reads_only_the_used_entries():
    bt = _i32([0, 1, -1], [2, 9, 9])
    lens = torch.tensor([10, 3], dtype=torch.int32)          # 2 pages and 1 page of 8
    t, l = D.guard_pages(bt, 5, lens, 8)
    assert t is bt and l is lens
    with pytest.raises(InvalidProblem, match="outside the pool of 5 pages"):
        D.guard_pages(bt, 5, torch.tensor([17, 3], dtype=torch.int32), 8)   # batch 0 now reads the -1
    with pytest.raises(InvalidProblem, match="outside the pool"):            # appendkv: the appended rows' page
        D.guard_pages(bt, 5, torch.tensor([10, 8], dtype=torch.int32), 8, appended=1)
    with pytest.raises(InvalidProblem, match="int32"):
        D.guard_pages(bt.float(), 5, lens, 8)


def test_host_check_of_sglang_indices_stops_at_the_last_offset():
    idx = torch.tensor([0, 4, 1, 77], dtype=torch.int32)
    D.guard_pages(idx, 5, torch.tensor([3, 5], dtype=torch.int32), 4, indptr=torch.tensor([0, 1, 3]))
    with pytest.raises(InvalidProblem, match="77"):
        D.guard_pages(idx, 5, torch.tensor([3, 5], dtype=torch.int32), 4, indptr=torch.tensor([0, 1, 4]))


@pytest.fixture
def clean_flags():
    D._FLAGS.clear()
    yield
    D._FLAGS.clear()


def test_device_form_marks_the_bad_batches_and_clamps(clean_flags):
    bt = _i32([0, 1, -1], [2, 9, 9], [3, 7, 0])
    t, l = D.guard_on_device(bt, 5, torch.tensor([10, 3, 20], dtype=torch.int32), 8)
    assert l.tolist() == [10, 3, -1]                  # batch 2 reads page 7; batch 1's 9s are padding
    assert t.tolist() == [[0, 1, 0], [2, 4, 4], [3, 4, 0]] and t.dtype == torch.int32
    assert int(D.flag("cpu")) == D.BAD_PAGES
    with pytest.raises(D.DeviceLengthError, match="outside the page pool"):
        D.raise_pending()
    t, l = D.guard_on_device(torch.tensor([0, 7, 1, 2, 99], dtype=torch.int32), 5,
                             torch.tensor([5, 9, 1], dtype=torch.int32), 4, indptr=_i32(0, 1, 3, 4))
    assert l.tolist() == [5, -1, 1] and max(t.tolist()) == 4   # index 4 (99) lies past the last offset


def test_public_calls_refuse_a_page_past_the_pool():
    from ck_fmha import decode
    from ck_fmha.prefill import batch_prefill

    q, pool = torch.randn(2, 4, 1, 64).half(), torch.randn(5, 8, 2, 64).half()
    lens = torch.tensor([10, 10], dtype=torch.int32)
    with pytest.raises(InvalidProblem, match="outside the pool"):
        decode.paged_decode(q, pool, pool, _i32([0, 1], [2, 7]), lens)
    decode.paged_decode(q, pool, pool, _i32([0, 1, 99], [2, 3, -5]), lens)   # padding past the used pages
    qp = torch.randn(4, 4, 64).half()
    with pytest.raises(InvalidProblem, match="outside the pool"):
        batch_prefill(qp, pool, pool, lens, cu_seqlens_q=_i32(0, 2, 4), max_seqlen_q=2, max_seqlen_k=16,
                      block_table=_i32([0, 1], [5, 3]))


@pytest.mark.gpu
def test_gpu_bad_page_gives_nan_rows_and_the_flag(clean_flags):
    if os.environ.get("CK_TEST_GPU") != "1" or not torch.cuda.is_available():
        pytest.skip("needs CK_TEST_GPU=1 and a CUDA device")
    from ck_fmha import check_errors, decode

    dev = "cuda"
    q, pool = torch.randn(2, 4, 1, 64, device=dev).half(), torch.randn(5, 8, 2, 64, device=dev).half()
    o = decode.paged_decode(q, pool, pool, torch.tensor([[0, 1], [2, 1000]], dtype=torch.int32, device=dev),
                            torch.tensor([10, 10], dtype=torch.int32, device=dev))
    assert torch.isfinite(o[0]).all() and torch.isnan(o[1]).all()
    with pytest.raises(D.DeviceLengthError, match="page pool"):
        check_errors()


def _used_bad(table, lens, n_pages, page_size, appended=0, indptr=None):
    """Reference, from the definition: the batches with a used page outside [0, n_pages) (with ``indptr``:
    or offsets outside the flat table)."""
    out = []
    for b, n in enumerate(lens):
        need = -(-(max(n, 0) + appended) // page_size)
        if indptr is None:
            used = table[b][:need]
        else:
            lo, hi = indptr[b], indptr[b + 1]
            if lo < 0 or hi > len(table) or hi < lo:
                out.append(True)
                continue
            used = table[lo:lo + min(need, hi - lo)]
        out.append(any(not 0 <= v < n_pages for v in used))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_guard_kernel_marks_exactly_the_bad_batches(clean_flags, seed):
    from ck_fmha.backends.triton.guards import PageGuard

    g = torch.Generator().manual_seed(seed)
    b, width, n_pages, ps = 2 + seed, 3 + 2 * seed, 6, 4
    for appended in (0, 2):
        bt = torch.randint(-2, n_pages + 2, (b, width), generator=g, dtype=torch.int32)
        bt = bt.t().contiguous().t() if seed == 1 else bt        # strided rows too
        lens = torch.randint(0, width * ps + 3, (b,), generator=g, dtype=torch.int32)
        want = _used_bad(bt.tolist(), lens.tolist(), n_pages, ps, appended)
        got = PageGuard(n_pages, ps, appended=appended).on_device(bt, lens)
        assert got.tolist() == [-1 if w else n for w, n in zip(want, lens.tolist())]
        assert int(D.flag("cpu")) == (D.BAD_PAGES if any(want) else 0)
        D.flag("cpu").zero_()
    idx = torch.randint(-1, n_pages + 1, (3 * b,), generator=g, dtype=torch.int32)
    cuts = sorted(torch.randint(0, 3 * b + 1, (b - 1,), generator=g).tolist())
    for indptr in ([0, *cuts, 3 * b], [0, *cuts, 3 * b + 1], [1, 0, *cuts[1:], 2]):   # good, past the end, decreasing
        indptr = indptr[:b + 1]
        lens = torch.randint(0, 3 * ps, (b,), generator=g, dtype=torch.int32)
        want = _used_bad(idx.tolist(), lens.tolist(), n_pages, ps, indptr=indptr)
        got = PageGuard(n_pages, ps, flat=True, name="kv_page_indices").on_device(
            idx, lens, torch.tensor(indptr, dtype=torch.int64))
        assert got.tolist() == [-1 if w else n for w, n in zip(want, lens.tolist())]
        D.flag("cpu").zero_()


class _InterpretedReplay:
    """A stand-in for a recorded launch (triton_replay.Replay) that the interpreter runs."""

    def __init__(self, fn, grid, args, kwargs):
        self.fn, self.grid, self.names = fn, grid, tuple(fn.arg_names)
        self.consts = dict(kwargs)
        self.args = list(args) + [kwargs[n] for n in self.names[len(args):]]
        fn[grid](*args, **kwargs)
        self.calls = 0

    def slot(self, name):
        return self.names.index(name)

    def __call__(self, args):
        self.calls += 1
        n = len(self.args) - len(self.consts)
        assert all(a is not None for a in args)
        self.fn[self.grid](*args[:n], **self.consts)


def test_recorded_guard_replays_with_the_new_tensors(clean_flags, monkeypatch):
    from ck_core.backends import triton_replay
    from ck_fmha.backends.triton.guards import PageGuard

    made = []
    monkeypatch.setattr(triton_replay, "replayable", lambda t: True)
    monkeypatch.setattr(triton_replay, "record", lambda fn, grid, args, kw, **_: made.append(
        _InterpretedReplay(fn, grid, args, kw)) or made[-1])
    guard = PageGuard(5, 8)
    bt, lens = _i32([0, 1, 4], [2, 3, 4]), torch.tensor([17, 9], dtype=torch.int32)
    t, first = guard.on_device(bt, lens), None
    assert t.tolist() == [17, 9] and len(made) == 1 and made[0].calls == 0
    for bad_row in (0, 1):
        bt2 = bt.clone()
        bt2[bad_row, 1] = 5
        lens2 = torch.tensor([12, 16], dtype=torch.int32)
        t2, l2 = guard.__call__(bt2, lens2)
        assert t2 is bt2 and l2.tolist() == [-1 if r == bad_row else n for r, n in enumerate((12, 16))]
    assert made[0].calls == 2 and len(made) == 1
    assert int(D.flag("cpu")) == D.BAD_PAGES


@pytest.mark.gpu
def test_gpu_warm_replay_guards_every_call(clean_flags):
    """The recorded guard (PageGuard's replay) checks each warm call's own table: a good call, then one of
    the same signature with a page past the pool (NaN rows for that batch alone, the flag), then a good one."""
    if os.environ.get("CK_TEST_GPU") != "1" or not torch.cuda.is_available():
        pytest.skip("needs CK_TEST_GPU=1 and a CUDA device")
    from ck_fmha import check_errors, decode
    from ck_fmha.prefill import batch_prefill

    dev = "cuda"
    q, pool = torch.randn(2, 4, 1, 64, device=dev).half(), torch.randn(6, 8, 2, 64, device=dev).half()
    lens = torch.tensor([10, 10], dtype=torch.int32, device=dev)
    good = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=dev)
    bad = torch.tensor([[0, 1], [2, 1000]], dtype=torch.int32, device=dev)
    qp = torch.randn(4, 4, 64, device=dev).half()
    cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=dev)
    for _ in range(3):
        o = decode.paged_decode(q, pool, pool, good, lens)
        op = batch_prefill(qp, pool, pool, lens, cu_seqlens_q=cu, max_seqlen_q=2, max_seqlen_k=16, block_table=good)
        assert torch.isfinite(o).all() and torch.isfinite(op).all()
    check_errors()
    o = decode.paged_decode(q, pool, pool, bad, lens)
    op = batch_prefill(qp, pool, pool, lens, cu_seqlens_q=cu, max_seqlen_q=2, max_seqlen_k=16, block_table=bad)
    assert torch.isfinite(o[0]).all() and torch.isnan(o[1]).all()
    assert torch.isfinite(op[:2]).all() and torch.isnan(op[2:]).all()
    with pytest.raises(D.DeviceLengthError, match="page pool"):
        check_errors()
    assert torch.isfinite(decode.paged_decode(q, pool, pool, good, lens)).all()
    check_errors()
