"""Split-KV / paged decode: one launch where one split is enough, splits from the ArchSpec otherwise,
and every power-of-two page size from 1 to 256 (Triton interpreter and numpy, float64 references)."""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import api  # noqa: E402
from ck_core.plugins import get_manager  # noqa: E402

from ck_fmha.heuristics import split_count  # noqa: E402
from ck_fmha.plan import plan  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402


@pytest.mark.parametrize("arch", ["sm90", "gfx942", "gfx90a"])
def test_one_split_once_batch_heads_and_query_tiles_fill_the_arch(arch, ck_rng):
    """The count follows the ArchSpec's compute units: a grid of batch x KV heads x query tiles that
    fills them gets one split (one launch), whatever the cache length; one program short of that, a
    long cache is split again; a short cache never is."""
    cus = get_manager().arch(arch).compute_units
    long_kv = 1 << 16
    for rows, tiles in ((1, 1), (64, 1), (65, 2), (4 * 64, 4)):
        full = -(-cus // tiles)                              # batch x heads that fill the machine
        for bh in (full, full + int(ck_rng.integers(1, 50)), 4 * full):
            assert split_count(bh, long_kv, cus, query_rows=rows) == 1
        if full > 1:
            s = split_count(full - 1, long_kv, cus, query_rows=rows)
            assert s > 1 and (full - 1) * tiles * s >= cus   # the splits fill it again
        assert split_count(1, 511, cus, query_rows=rows) == 1   # fewer than two chunks of keys
    # a machine with more compute units splits the same cache further
    a, b = sorted(get_manager().arch(n).compute_units for n in ("sm90", "gfx942"))
    assert split_count(8, long_kv, a) < split_count(8, long_kv, b)


@pytest.mark.parametrize("paged", [False, True])
def test_one_split_plan_is_one_stage(paged):
    kw = dict(family="fwd_splitkv", batch=2, nhead_q=4, nhead_k=2, seqlen_q=1, seqlen_k=512, hdim_q=64, hdim_v=64,
              dtype="fp16", lse=True)
    if paged:
        kw.update(paged_kv=True, page_size=16, runtime_seqlens_k=True)
    assert [n for n, _ in plan(FmhaProblem(**kw, num_splits=1))] == ["fwd_splitkv"]
    assert [n for n, _ in plan(FmhaProblem(**kw, num_splits=3))] == ["fwd_splitkv", "fwd_splitkv_combine"]


def _ref(q, k, v, lens):
    """float64 bottom-right causal attention of q [B, Hq, Sq, D] over each batch's first lens[b] keys
    of k / v [B, Hk, S, D] (GQA: Hq a multiple of Hk)."""
    q, k, v = (x.double() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    o = torch.empty(q.shape[:3] + (v.shape[-1],), dtype=torch.float64)
    lse = torch.empty(q.shape[:3], dtype=torch.float64)
    sq = q.shape[2]
    for b, n in enumerate(lens):
        s = q[b] @ k[b, :, :n].transpose(-1, -2) / q.shape[-1] ** 0.5
        i, j = torch.arange(sq)[:, None], torch.arange(n)[None, :]
        s = s.masked_fill(j > i + n - sq, float("-inf"))
        o[b] = torch.softmax(s, -1) @ v[b, :, :n]
        lse[b] = torch.logsumexp(s, -1)
    return o, lse


def _pages(k, v, ps, g):
    """k / v [B, Hk, S, D] scattered into NaN-poisoned page pools [pages, ps, Hk, D] (random block table)."""
    b, hk, sk, d = k.shape
    npg = -(-sk // ps)
    table = torch.randperm(b * npg + 3, generator=g)[:b * npg].view(b, npg).to(torch.int32)
    kc = torch.full((b * npg + 3, ps, hk, d), float("nan"), dtype=k.dtype)
    vc = kc.clone()
    pad = lambda x: torch.nn.functional.pad(x, (0, 0, 0, npg * ps - sk))   # noqa: E731
    kp, vp = pad(k), pad(v)
    for bi in range(b):
        for pi in range(npg):
            kc[table[bi, pi]] = kp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
            vc[table[bi, pi]] = vp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
    return kc, vc, table


@pytest.fixture
def launches(monkeypatch):
    """The split-KV kernels each call launched, by name (main / combine)."""
    from ck_fmha.backends.triton import kernels as K

    out = []

    class Spy:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            def call(*a, **kw):
                out.append((self.name, tuple(grid), kw.get("DIRECT", False)))
                return self.fn[grid](*a, **kw)
            return call

    for attr, name in (("fmha_fwd_splitkv_kernel", "main"), ("fmha_fwd_splitkv_combine_kernel", "combine")):
        monkeypatch.setattr(K, attr, Spy(name, getattr(K, attr)))
    return out


@pytest.mark.parametrize("paged", [False, True])
def test_a_cache_that_fills_the_machine_decodes_in_one_launch(ck_dispatch_log, launches, ck_rng, paged, monkeypatch):
    """batch x KV heads = the (fake) arch's compute units: the Dispatcher's count is 1, the plan one stage,
    one kernel launch writes o and lse; both match float64."""
    from ck_fmha import decode as ops

    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    cus = get_manager().arch(os.environ["CK_CPU_ARCH"]).compute_units   # the fake arch's (ck_dispatch_log)
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    hk = 2
    b, hq, sq, sk, d = -(-cus // hk), 4, 1, 600, 32
    q, k, v = (torch.randn(b, h, s, d, generator=g, dtype=torch.float16) for h, s in ((hq, sq), (hk, sk), (hk, sk)))
    lens = [int(x) for x in ck_rng.integers(1, sk + 1, size=b)]
    sl = torch.tensor(lens, dtype=torch.int32)
    if paged:
        kc, vc, table = _pages(k, v, 16, g)
        o, lse = ops.paged_decode(q.transpose(1, 2), kc, vc, table, sl, causal=True, layout="bshd", return_lse=True)
        o = o.transpose(1, 2)
    else:
        o, lse = ops.splitkv_decode(q, k, v, seqlens_k=sl, causal=True, return_lse=True)
    (p, names, _), = ck_dispatch_log.take()
    assert p.num_splits == 1 and len(names) == 1 and "_k1." in names[0]
    assert [(n, grid[0], direct) for n, grid, direct in launches] == [("main", 1, True)]
    ro, rl = _ref(q, k, v, lens)
    assert float((o.double() - ro).norm() / ro.norm()) < 1e-2
    assert float((lse.double() - rl).abs().max()) < 2e-2
    api.clear()


PAGE_SIZES = (1, 8, 16, 32, 64, 128, 256)


@pytest.mark.parametrize("backend", [
    "numpy", pytest.param("triton", marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors run Triton only in the interpreter"))])
def test_every_page_size(backend, ck_dispatch_log, ck_rng, monkeypatch):
    """Page sizes 1 .. 256 (powers of two) are accepted and right, with one split (one launch) and with
    several (main + combine), against float64 over the unpaged keys; the pools' unused slots are NaN."""
    from ck_fmha import decode as ops

    monkeypatch.setenv("CK_BACKEND", backend)
    api.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    b, hq, hk, sq, d = 2, 2, 1, 1, 16
    for i, ps in enumerate(PAGE_SIZES):
        sk = ps + int(ck_rng.integers(1, 40))                 # at least two pages
        q, k, v = (torch.randn(b, h, s, d, generator=g, dtype=torch.float16) for h, s in ((hq, sq), (hk, sk), (hk, sk)))
        lens = [sk, int(ck_rng.integers(1, sk + 1))]
        kc, vc, table = _pages(k, v, ps, g)
        ns = 1 if i % 2 == 0 else 3
        o, lse = ops.paged_decode(q.transpose(1, 2), kc, vc, table, torch.tensor(lens, dtype=torch.int32),
                                  causal=True, layout="bshd", num_splits=ns, return_lse=True)
        (p, names, _), = ck_dispatch_log.take()
        assert p.page_size == ps and p.num_splits == ns and len(names) == (1 if ns == 1 else 2)
        ro, rl = _ref(q, k, v, lens)
        got = o.transpose(1, 2).double()
        assert torch.isfinite(got).all(), ps
        assert float((got - ro).norm() / ro.norm()) < 1e-2, ps
        assert float((lse.double() - rl).abs().max()) < 2e-2, ps
    api.clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fill", [True, False])
def test_every_page_size_on_gpu(fill, ck_rng):
    """The Dispatcher's own split count on the GPU: batch x KV heads filling the ArchSpec's compute units
    (one launch) or not (split + combine), every page size, against float64."""
    from ck_core.device import current_arch
    from ck_fmha import decode as ops

    api.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    hq, hk, sq, d = 8, 2, 1, 64
    cus = current_arch(torch.empty(1, device="cuda")).compute_units
    b = -(-cus // hk) if fill else 2
    for ps in PAGE_SIZES:
        sk = 2 * ps + int(ck_rng.integers(1, 300))
        q, k, v = (torch.randn(b, h, s, d, generator=g, dtype=torch.bfloat16) for h, s in ((hq, sq), (hk, sk), (hk, sk)))
        lens = [int(x) for x in ck_rng.integers(1, sk + 1, size=b)]
        kc, vc, table = _pages(k, v, ps, g)
        o, lse = ops.paged_decode(q.transpose(1, 2).cuda(), kc.cuda(), vc.cuda(), table.cuda(),
                                  torch.tensor(lens, dtype=torch.int32, device="cuda"), causal=True, layout="bshd",
                                  return_lse=True)
        ro, rl = _ref(q, k, v, lens)
        got = o.transpose(1, 2).double().cpu()
        assert torch.isfinite(got).all(), ps
        assert float((got - ro).norm() / ro.norm()) < 2e-2, ps
        assert float((lse.double().cpu() - rl).abs().max()) < 5e-2, ps
    api.clear()
