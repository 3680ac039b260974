"""Run-time (device) seqlens_k outside the key capacity: the decode, appendkv and batch_prefill
kernels never address outside the cache or the block table, poison the bad batch's outputs with
NaN and report the error (ck_fmha.device_errors).  On the CPU the API's host check would refuse
the lengths first, so these tests call the kernel-direct paths (an explicit config), which read
the lengths only in the kernel, as a GPU call does."""
from __future__ import annotations

import os
import sys

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
sys.path.insert(0, os.path.dirname(__file__))

from triton_ref import ref_attention, rel_err  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover
    pytest.skip("these tests run the kernels in the Triton interpreter", allow_module_level=True)

import ck_fmha  # noqa: E402
from ck_fmha.backends.triton import TritonFmhaConfig  # noqa: E402
from ck_fmha.decode import paged_decode, splitkv_decode  # noqa: E402
from ck_fmha.backends.triton.launch_decode import appendkv_launch, batch_prefill_launch  # noqa: E402
from ck_fmha.device_errors import DeviceLengthError  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")]

SMALL = TritonFmhaConfig(16, 16, 4, 1)
TOL = 2e-3
SENTINEL = 1234.0   # guard regions around the caches: any write there shows


@pytest.fixture(autouse=True)
def _clean_flag():
    try:   # a flag left by another test is not this test's error
        ck_fmha.check_errors()
    except DeviceLengthError:
        pass
    yield


def _expect_error(word):
    with pytest.raises(DeviceLengthError, match=word):
        ck_fmha.check_errors()
    ck_fmha.check_errors()   # reading the flag reset it


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).half()


@pytest.mark.parametrize("bad,word", [(41, "past the key capacity"), (-3, "negative")])
def test_splitkv_and_paged_decode_bad_length(bad, word):
    b, hq, hk, sq, sk, d = 2, 4, 2, 1, 37, 32
    q, k, v = _rand(b, hq, sq, d, seed=1), _rand(b, hk, sk, d, seed=2), _rand(b, hk, sk, d, seed=3)
    lens = torch.tensor([bad, 23], dtype=torch.int32)
    o, lse = splitkv_decode(q, k, v, seqlens_k=lens, num_splits=3, return_lse=True, config=SMALL)
    ro, rl = ref_attention(q[1:], k[1:], v[1:], seqlens_k=lens[1:])
    assert torch.isnan(o[0]).all() and torch.isnan(lse[0]).all()      # the bad batch cannot pass for a result
    assert rel_err(o[1:], ro) < TOL and rel_err(lse[1:], rl) < 1e-5   # the good one is untouched
    _expect_error(word)

    ps, npg = 8, 5   # 40 slots per batch: lengths up to 40 are in range
    pool = torch.full((2 * npg + 2, ps, hk, d), float("nan")).half()   # unlisted pages are NaN
    table = torch.arange(1, 2 * npg + 1, dtype=torch.int32).view(2, npg)
    kp = torch.nn.functional.pad(k, (0, 0, 0, npg * ps - sk))
    for bi in range(2):
        for pi in range(npg):
            pool[table[bi, pi]] = kp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
    o2 = paged_decode(q, pool, pool, table, lens, num_splits=2, config=SMALL)
    ro2, _ = ref_attention(q[1:], k[1:], k[1:], seqlens_k=lens[1:])
    assert torch.isnan(o2[0]).all() and rel_err(o2[1:], ro2) < TOL
    _expect_error(word)


@pytest.mark.parametrize("ps, ns", [(8, 1), (8, 3), (32, 1), (32, 2)])   # page < / = a multiple of BLOCK_N (16)
def test_paged_decode_kernel_checks_every_page_it_reads(ps, ns):
    """The split-KV kernel itself (no guard launch: the GPU's paged_decode, and any call with a config)
    reads no page outside the pool: that batch's outputs are NaN and the flag names the page pool; the
    other batch's are the float64 reference's, and entries past a batch's length are never looked at."""
    b, hq, hk, sq, d = 2, 4, 2, 1, 32
    lens = [37, 23]
    npg = -(-max(lens) // ps)
    q, k = _rand(b, hq, sq, d, seed=11), _rand(b, hk, npg * ps, d, seed=12)
    pool = torch.full((2 * npg + 1, ps, hk, d), float("nan")).half()   # unlisted pages are NaN
    table = torch.arange(1, 2 * npg + 1, dtype=torch.int32).view(2, npg)
    for bi in range(2):
        for pi in range(npg):
            pool[table[bi, pi]] = k[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
    bad = table.clone()
    bad[0, (lens[0] - 1) // ps] = 2 * npg + 7         # the page of batch 0's last key: outside the pool
    if (lens[1] - 1) // ps + 1 < npg:
        bad[1, -1] = -5                                # past batch 1's length: never read, no error
    seqlens = torch.tensor(lens, dtype=torch.int32)
    o, lse = paged_decode(q, pool, pool, bad, seqlens, num_splits=ns, config=SMALL, return_lse=True)
    ro, rl = ref_attention(q[1:], k[1:, :, :lens[1]], k[1:, :, :lens[1]])
    assert torch.isnan(o[0]).all() and torch.isnan(lse[0]).all()
    assert rel_err(o[1:], ro) < TOL and rel_err(lse[1:], rl) < 1e-5
    _expect_error("page pool")
    o = paged_decode(q, pool, pool, table, seqlens, num_splits=ns, config=SMALL)   # the good table: no error
    ro, _ = ref_attention(q[:1], k[:1, :, :lens[0]], k[:1, :, :lens[0]])
    assert rel_err(o[:1], ro) < TOL
    ck_fmha.check_errors()


def test_next_call_raises_a_pending_error():
    """On the CPU the flag is read for free: the next decode call raises, then the flag is clear."""
    q, k = _rand(1, 2, 1, 16, seed=4), _rand(1, 2, 9, 16, seed=5)
    splitkv_decode(q, k, k, seqlens_k=torch.tensor([10], dtype=torch.int32), num_splits=1, config=SMALL)
    with pytest.raises(DeviceLengthError, match="seqlens_k"):
        splitkv_decode(q, k, k, seqlens_k=torch.tensor([9], dtype=torch.int32), num_splits=1, config=SMALL)
    o = splitkv_decode(q, k, k, seqlens_k=torch.tensor([9], dtype=torch.int32), num_splits=1, config=SMALL)
    assert not torch.isnan(o).any()


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("bad,word", [(20, "past the key capacity"), (-1, "negative")])
def test_appendkv_bad_length_writes_nothing(paged, bad, word):
    b, hq, hk, sq, sn, d, cap = 2, 2, 1, 3, 4, 32, 24   # cap - sn = 20: a base of 21 writes past the end
    bad = bad + 1 if bad > 0 else bad
    q, knew, vnew = _rand(b, hq, sq, d, seed=6), _rand(b, hk, sn, d, seed=7), _rand(b, hk, sn, d, seed=8)
    lens = torch.tensor([bad, 5], dtype=torch.int32)
    if paged:
        ps = 8
        buf = torch.full((2 * 3 + 2, hk, ps, d), SENTINEL).half()   # page 0 and the last page: guards
        kc, vc = buf[1:-1], buf.clone()[1:-1]
        table = torch.arange(2 * 3, dtype=torch.int32).view(2, 3)
    else:
        buf = torch.full((b + 2, hk, cap, d), SENTINEL).half()      # batch slots 0 and -1: guards
        kc, vc = buf[1:-1], buf.clone()[1:-1]
        table = None
    kbase, vbase = kc._base.clone(), vc._base.clone()
    q_rot, _, _ = appendkv_launch(q, knew, vnew, kc, vc, lens, block_table=table)
    assert torch.isnan(q_rot[0]).all() and torch.equal(q_rot[1], q[1])
    kwant, vwant = kbase.clone(), vbase.clone()   # batch 1's rows land at positions 5..8, batch 0 writes none
    if paged:   # positions 5..8 cross a page boundary
        for i in range(sn):
            pg, slot = 1 + int(table[1, (5 + i) // ps]), (5 + i) % ps
            kwant[pg, :, slot], vwant[pg, :, slot] = knew[1, :, i], vnew[1, :, i]
    else:
        kwant[2, :, 5:5 + sn], vwant[2, :, 5:5 + sn] = knew[1], vnew[1]
    assert torch.equal(kc._base, kwant) and torch.equal(vc._base, vwant)
    _expect_error(word)


@pytest.mark.parametrize("lookup", ["vllm", "sglang"])
@pytest.mark.parametrize("bad,word", [(17, "past the key capacity"), (-5, "negative")])
def test_batch_prefill_bad_length(lookup, bad, word):
    ps, hq, hk, d = 4, 2, 1, 32
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    q = _rand(12, hq, d, seed=9)
    pool = _rand(9, ps, hk, d, seed=10)
    lens = torch.tensor([bad, 11], dtype=torch.int32)   # 4 pages per batch: 16 keys is the capacity
    pages = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32)
    tab = (dict(block_table=pages) if lookup == "vllm" else
           dict(kv_indptr=torch.tensor([0, 4, 8], dtype=torch.int32), kv_page_indices=pages.flatten()))
    o, lse = batch_prefill_launch(q, pool, pool, lens, cu_seqlens_q=cu_q, max_seqlen_q=7, max_seqlen_k=16,
                                  return_lse=True, config=SMALL, **tab)
    assert torch.isnan(o[:5]).all() and torch.isnan(lse[:, :5]).all()
    kv = pool[pages[1]].reshape(16, hk, d)[:11].transpose(0, 1)[None]
    ro, rl = ref_attention(q[5:].transpose(0, 1)[None], kv, kv)
    assert rel_err(o[5:], ro[0].transpose(0, 1)) < TOL and rel_err(lse[:, 5:], rl[0]) < 1e-5
    _expect_error(word)


def test_batch_prefill_sglang_length_past_its_pages():
    """Within max_seqlen_k but past the batch's own pages (kv_indptr): the next batch's pages are
    not read as this batch's keys."""
    ps, h, d = 4, 1, 16
    cu_q = torch.tensor([0, 3, 6], dtype=torch.int32)
    q, pool = _rand(6, h, d, seed=11), _rand(7, ps, h, d, seed=12)
    indptr = torch.tensor([0, 2, 6], dtype=torch.int32)   # batch 0 owns 2 pages (8 keys), batch 1 owns 4
    pages = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32)
    lens = torch.tensor([9, 13], dtype=torch.int32)
    o = batch_prefill_launch(q, pool, pool, lens, cu_seqlens_q=cu_q, max_seqlen_q=3, max_seqlen_k=16,
                             kv_indptr=indptr, kv_page_indices=pages, config=SMALL)
    assert torch.isnan(o[:3]).all()
    kv = pool[pages[2:]].reshape(16, h, d)[:13].transpose(0, 1)[None]
    ro, _ = ref_attention(q[3:].transpose(0, 1)[None], kv, kv)
    assert rel_err(o[3:], ro[0].transpose(0, 1)) < TOL
    _expect_error("past the key capacity")
