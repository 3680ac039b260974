"""Issue 16's kernel variants, run in the Triton interpreter on odd sizes against a float64 attention
written here: the forward with head-dim chunks (``DCHUNK``: 160 = 128 + 32 instead of one tile of 256),
the dK/dV kernel with dK and dV in separate programs (``kvsplit``) and with a GQA group split over
programs (``GSPLIT``, fp32 partials); their keys (names, legality, enumeration, the heuristic's pick)
and the launcher path from a key to the kernel."""
from __future__ import annotations

import os

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover
    pytest.skip("these tests run the kernels in the Triton interpreter", allow_module_level=True)

from ck_fmha.backends.triton import bwd, fwd  # noqa: E402
from ck_fmha.backends.triton import launch as ops  # noqa: E402
from ck_fmha.backends.triton import launch_bwd as ops_bwd  # noqa: E402
from ck_fmha.backends.triton.configs import TritonFmhaConfig as C  # noqa: E402
from ck_fmha.backends.triton.configs import hdim_blocks  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]


def _attention64(q, k, v, causal=False, window=None, softcap=0.0):
    """softmax(q k^T / sqrt(d)) v in float64 on [B, H, S, D]; K/V heads repeated over their group;
    ``window`` = (left, right) of a top-left window."""
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = s.shape[-2:]
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    hide = torch.zeros(sq, sk, dtype=torch.bool)
    if causal:
        hide |= j > i
    if window is not None:
        hide |= (j < i - window[0]) | (j > i + window[1])
    s = s.masked_fill(hide, float("-inf"))
    return torch.softmax(s, -1) @ v


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _qkv(b, hq, hk, s, dq, dv, seed, sk=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, dq, generator=g).half()
    k = torch.randn(b, hk, sk or s, dq, generator=g).half()
    v = torch.randn(b, hk, sk or s, dv, generator=g).half()
    return q, k, v


def test_hdim_blocks():
    assert hdim_blocks(160, 128) == (128, 32)
    assert hdim_blocks(192, 128) == (128, 64)
    assert hdim_blocks(80, 64) == (64, 16)
    assert hdim_blocks(96, 64) == (64, 32)
    assert hdim_blocks(136, 128) == (128, 16)
    assert hdim_blocks(128, 128) == (128, 0)     # no split at or below the chunk
    assert hdim_blocks(160, 0) == (256, 0)       # no chunk: padded as before
    assert hdim_blocks(40, 0) == (64, 0)


@pytest.mark.parametrize("dq,dv,chunk,hq,hk,causal,softcap", [
    (160, 160, 128, 4, 2, False, 0.0),
    (80, 80, 64, 3, 1, True, 0.0),
    (192, 136, 128, 2, 2, True, 0.0),     # only q's head dim splits (v's 136 = 128 + 16 too)
    (96, 96, 64, 2, 1, False, 20.0),
])
def test_forward_head_dim_chunks(dq, dv, chunk, hq, hk, causal, softcap):
    s = 37   # tails in every tile
    q, k, v = _qkv(2, hq, hk, s, dq, dv, dq + chunk)
    o, lse = fwd(q, k, v, causal=causal, softcap=softcap, return_lse=True, config=C(32, 16, 4, 1, "ptr", chunk))
    ref = _attention64(q, k, v, causal, softcap=softcap)
    assert _rel(o, ref) < 2e-3
    o_pad, lse_pad = fwd(q, k, v, causal=causal, softcap=softcap, return_lse=True, config=C(32, 16, 4, 1, "ptr"))
    assert float((lse - lse_pad).abs().max()) < 1e-3   # the same softmax statistics as the padded tile


def test_forward_head_dim_chunks_window_group_mode():
    """Group mode (ragged lengths) with a sliding window, head dim 160 in chunks 128 + 32."""
    lens = (23, 41)
    hq, hk, d = 2, 1, 160
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lens), hq, d, generator=g).half()
    k = torch.randn(sum(lens), hk, d, generator=g).half()
    v = torch.randn(sum(lens), hk, d, generator=g).half()
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
    o = fwd(q, k, v, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
            max_seqlen_k=max(lens), window=(7, 3), config=C(32, 16, 4, 1, "ptr", 128))
    for i, n in enumerate(lens):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        ref = _attention64(*(t[sl].transpose(0, 1)[None] for t in (q, k, v)), window=(7, 3))
        assert _rel(o[sl].transpose(0, 1)[None], ref) < 2e-3


def test_chunks_refused_where_they_do_not_run():
    from ck_core.errors import CkError

    q, k, v = _qkv(1, 2, 2, 16, 160, 160, 1)
    with pytest.raises(CkError, match="DCHUNK"):
        fwd(q, k, v, config=C(32, 16, 4, 1, "ptr", 96))     # not a power of two


def _grads(q, k, v, do, causal, window=None):
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    ref = _attention64(qd, kd, vd, causal, window=window)
    ref.backward(do.double())
    return ref.detach(), (qd.grad, kd.grad, vd.grad)


@pytest.mark.parametrize("d,hq,hk,causal,variant,gsplit,chunk", [
    (160, 4, 2, False, "kvsplit", 0, 0),
    (72, 3, 3, True, "kvsplit", 0, 0),
    (48, 6, 1, True, "ptr", 4, 0),        # group 6 over 4 programs: 2 + 2 + 2 + 0 heads
    (40, 5, 1, False, "kvsplit", 2, 0),   # uneven halves of the group, with kvsplit
    (64, 6, 2, True, "ptr", 16, 0),       # a split above the group size is clamped to it
    (160, 2, 1, True, "ptr", 0, 128),     # head-dim chunks 128 + 32 in both backward kernels
    (80, 4, 2, False, "kvsplit", 2, 64),  # chunks 64 + 16 with kvsplit and a group split
])
def test_backward_variants(d, hq, hk, causal, variant, gsplit, chunk):
    s = 29
    q, k, v = _qkv(1, hq, hk, s, d, d, d + hq + gsplit)
    do = torch.randn(1, hq, s, d, generator=torch.Generator().manual_seed(3)).half()
    o, lse = fwd(q, k, v, causal=causal, return_lse=True, config=C(32, 16, 4, 1, "ptr"))
    ref, want = _grads(q, k, v, do, causal)
    assert _rel(o, ref) < 2e-3
    got = bwd(q, k, v, o, lse, do, causal=causal, config=(C(16, 16, 4, 1, variant, chunk, gsplit),
                                                          C(16, 16, 4, 1, "ptr", chunk)))
    for name, x, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(x).all(), name
        assert _rel(x, w) < 4e-3, name


def test_backward_group_split_with_atomic_dq_and_bshd():
    """GSPLIT with dQ by fp32 atomics (deterministic=False) and a bshd layout, a window mask."""
    s, hq, hk, d = 27, 4, 1, 32
    q, k, v = _qkv(2, hq, hk, s, d, d, 11)
    do = torch.randn(2, hq, s, d, generator=torch.Generator().manual_seed(4)).half()
    o, lse = fwd(q, k, v, window=(5, 2), return_lse=True, config=C(32, 16, 4, 1, "ptr"))
    ref, want = _grads(q, k, v, do, False, window=(5, 2))
    bs = lambda t: t.transpose(1, 2).contiguous()   # noqa: E731
    delta = ops_bwd.bwd_dot_do_o(bs(o), bs(do), layout="bshd")
    res = ops_bwd.bwd_dq_dk_dv(bs(q), bs(k), bs(v), bs(do), lse, delta, window=(5, 2), layout="bshd",
                           choice=(("triton", C(16, 16, 4, 1, "kvsplit", GSPLIT=4)), ("atomic",)))
    dq = ops_bwd.bwd_convert_dq(res[1], bs(q), layout="bshd")
    for name, x, w in zip(("dq", "dk", "dv"), (dq, res[2], res[3]), want):
        assert _rel(x.transpose(1, 2), w) < 4e-3, name


# -- keys -------------------------------------------------------------------------------------

def _sm90():
    from ck_core.plugins import get_manager

    return get_manager().arch("sm90")


def test_key_names_round_trip_and_legality():
    from ck_core.key import KernelKey
    from ck_fmha.backends.triton import keys as K

    for name, why in [("fmha_fwd_bf16_d160x160_m128n64_w8_s2_tma_c128", None),
                      ("fmha_fwd_fp16_d80x80_m128n64_w4_s2_ptr_c64", None),
                      ("fmha_bwd_dq_dk_dv_bf16_d256x256_m64n64_w8_s2_kvsplit_dqm128n64w8s1", None),
                      ("fmha_bwd_dq_dk_dv_bf16_d64x64_m128n128_w8_s2_ptr_g8_dqm64n64w4s3", None),
                      ("fmha_bwd_dq_dk_dv_bf16_d96x96_m64n128_w8_s3_kvsplit_g4_dqatomic", None),
                      ("fmha_fwd_bf16_d160x160_m128n64_w8_s2_tma_host_c128", "head-dim chunks"),
                      ("fmha_fwd_bf16_d128x128_m128n64_w4_s2_tma_c128", "below the head dims"),
                      ("fmha_fwd_bf16_d160x160_m128n64_w8_s2_tma_g4", "group split"),
                      ("fmha_bwd_dq_dk_dv_bf16_d64x64_m128n128_w8_s2_ptr_g3_dqm64n64w4s3", "group split"),
                      ("fmha_fwd_bf16_d256x256_m64n64_w8_s2_kvsplit", "not a fwd kernel"),
                      ("fmha_bwd_dq_dk_dv_bf16_d160x160_m64n64_w8_s2_kvsplit_c128_g2_dqm128n64w8s1", None),
                      ("fmha_bwd_dq_dk_dv_bf16_d128x128_m64n128_w4_s2_gluon_dkdv_c64_dqgluon64s4p", "head-dim chunks")]:
        s, a = K.parse_name(name)
        assert K.format_name(s, a) == name
        got = K.legal(KernelKey("fmha", s, a, "sm90", "triton"), _sm90())
        assert (got is None) if why is None else (why in got), (name, got)
    s, a = K.parse_name("fmha_bwd_dq_dk_dv_bf16_d64x64_m128n128_w8_s2_ptr_g8_dqm64n64w4s3")
    assert (a.gsplit, a.config().GSPLIT) == (8, 8)
    s, a = K.parse_name("fmha_fwd_bf16_d160x160_m128n64_w8_s2_tma_c128")
    assert a.config().DCHUNK == 128


def test_group_split_heuristic():
    from ck_fmha.heuristics import group_split

    rule = dict(waves=8, min_rows=2048)
    # MQA, 25 key blocks of 128 per batch, 2 batches: 50 programs on 132 SMs -> the whole group of 16
    assert group_split(2, 16, 1, 3168, 3168, 128, 132, rule) == 16
    assert group_split(2, 16, 1, 3168, 3168, 128, 132, {}) == 1                 # not measured: no split
    assert group_split(2, 16, 16, 3168, 3168, 128, 132, rule) == 1              # MHA: nothing to split
    assert group_split(20, 32, 8, 1201, 1201, 128, 132, rule) == 1              # 1600 programs already
    assert group_split(15, 32, 4, 195, 195, 128, 132, rule) == 1                # 195 rows: too little work
    assert group_split(2, 8, 1, 8528, 8528, 128, 132, rule) == 8                # 134 programs -> 1072
    assert group_split(2, 8, 1, 8528, 8528, 128, 132, dict(rule, waves=2)) == 2
    assert group_split(1, 6, 2, 4096, 4096, 64, 132, rule) == 2                 # at most the group (3)
    assert group_split(1, 8, 1, 2048, 2048, 64, 132, rule, parts=2) == 8
    assert group_split(1, 8, 1, 1024, 1024, 64, 132, rule) == 4                 # 2 heads x 1024 rows each


def test_dispatcher_picks_the_group_split_and_chunks_from_the_tables(monkeypatch):
    """With the arch's data naming a head-dim chunk and split waves, enumeration yields the chunked
    forward keys, and the heuristic ranks a split Triton dK/dV key first for an MQA problem with few key
    blocks (none for MHA); the Gluon dK/dV kernel gives way to it there."""
    from ck_fmha.backends.triton import keys as K
    from ck_fmha import heuristics as T
    from ck_fmha.heuristics import rank
    from ck_fmha.problem import FmhaProblem

    monkeypatch.setenv("TRITON_INTERPRET", "0")   # the Hopper choice, as on the GPU
    monkeypatch.setattr(T, "fwd_dchunk", lambda hq, hv, arch: 128 if max(hq, hv) in (160, 192) else 0)
    monkeypatch.setattr(T, "bwd_gsplit_rule", lambda arch: dict(waves=2, min_rows=1024, gluon_waves=1))
    K._tabled.cache_clear()
    arch = _sm90()
    fk = K.enumerate_keys(arch, "triton", {"hdims": [(160, 160)], "families": ["fwd"], "dtypes": ["bf16"]})
    assert fk and all(k.algorithm.dchunk == 128 for k in fk if k.algorithm.variant in ("ptr", "tma"))
    p = FmhaProblem(family="fwd", batch=2, nhead_q=8, seqlen_q=1000, seqlen_k=1000, hdim_q=160, dtype="bf16")
    kf = [k for k in fk if K.supports(k, p) is None]
    assert rank(p, kf, arch)[0].algorithm.dchunk == 128
    for hq, hk, d, want in [(16, 1, 64, 16), (16, 16, 64, 0), (16, 2, 128, 8)]:   # 16 / 32 key blocks
        ks = K.enumerate_keys(arch, "triton", {"hdims": [(d, d)], "families": ["bwd_dq_dk_dv"], "dtypes": ["bf16"]})
        pb = FmhaProblem(family="bwd_dq_dk_dv", batch=1, nhead_q=hq, nhead_k=hk, seqlen_q=2048, seqlen_k=2048,
                         hdim_q=d, dtype="bf16", mask="top_left", deterministic=True)
        first = rank(pb, [k for k in ks if K.supports(k, pb) is None], arch)[0].algorithm
        assert first.gsplit == want, (hq, hk, d, first)
        if want:
            assert first.variant in ("ptr", "kvsplit")
    K._tabled.cache_clear()


def test_launcher_runs_the_keys_variant(monkeypatch):
    """A key's launcher hands DCHUNK / kvsplit / GSPLIT to the kernels (CPU interpreter): the launches'
    tiles and grids are the key's, and the results are right."""
    from ck_core.key import KernelKey
    from ck_fmha.backends.triton import implement as KI, keys as K
    from ck_fmha.problem import FmhaProblem

    seen = {}
    real = ops._kernel

    def spy(via, kernel, grid):
        run = real(via, kernel, grid)

        def launch(*args, **kw):
            seen[getattr(kernel, "__name__", str(kernel))] = (tuple(grid), kw)
            return run(*args, **kw)
        return launch

    monkeypatch.setattr(ops, "_kernel", spy)
    monkeypatch.setattr(ops_bwd, "_kernel", spy)   # (the backward launchers, split from launch.py)

    def key(name):
        s, a = K.parse_name(name)
        return KernelKey("fmha", s, a, "gfx942", "triton")   # (a portable arch: pointer loads)

    b, hq, hk, s, d = 1, 4, 1, 33, 80
    q, k, v = _qkv(b, hq, hk, s, d, d, 21)
    p = FmhaProblem(family="fwd", batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=s, seqlen_k=s, hdim_q=d,
                    dtype="fp16", lse=True, mask="top_left")
    out = KI.make_launcher(key("fmha_fwd_fp16_d80x80_m32n16_w4_s1_ptr_c64"))(p, dict(q=q, k=k, v=v))
    ref = _attention64(q, k, v, causal=True)
    assert _rel(out["o"], ref) < 2e-3
    kw = seen["fmha_fwd_kernel"][1]
    assert (kw["BLOCK_DQ"], kw["BLOCK_DQ2"], kw["BLOCK_DV"], kw["BLOCK_DV2"]) == (64, 16, 64, 16)
    do = torch.randn(b, hq, s, d, generator=torch.Generator().manual_seed(8)).half()
    _, want = _grads(q, k, v, do, True)
    d_ = ops_bwd.bwd_dot_do_o(out["o"], do)
    pb = FmhaProblem(family="bwd_dq_dk_dv", batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=s, seqlen_k=s, hdim_q=d,
                     dtype="fp16", mask="top_left", deterministic=True)
    res = KI.make_launcher(key("fmha_bwd_dq_dk_dv_fp16_d80x80_m16n16_w4_s1_kvsplit_c64_g2_dqm16n16w4s1"))(
        pb, dict(q=q, k=k, v=v, do=do, lse=out["lse"], d=d_))
    for name, w in zip(("dq", "dk", "dv"), want):
        assert _rel(res[name], w) < 4e-3, name
    grid, kw = seen["fmha_bwd_dq_dk_dv_kernel"]
    assert kw["KV_SPLIT"] and grid == (3, 1, 4)   # 3 key blocks, 1 kv head, 2 parts x 2 group splits
    assert (kw["BLOCK_DQ"], kw["BLOCK_DQ2"]) == (64, 16)
    assert seen["fmha_bwd_dq_kernel"][1]["BLOCK_DQ2"] == 16   # the key's chunk in the dQ pass too


def test_backward_footprint_counts_one_dq_slice():
    """The Triton backward keeps no dq slice per key tile: a long backward is not refused for memory."""
    from ck_fmha import footprint
    from ck_fmha.problem import FmhaProblem

    p = FmhaProblem(family="bwd_dq_dk_dv", batch=3, nhead_q=32, nhead_k=8, seqlen_q=20175, seqlen_k=20175,
                    hdim_q=256, dtype="fp16", deterministic=True)
    tensors = footprint.bytes_moved(p)
    assert tensors < 20 * 2 ** 30
    assert footprint.working_bytes(p, "numpy") > 100 * 2 ** 30   # the reference's slices are its own


def test_backward_group_split_group_mode():
    """GSPLIT and head-dim chunks in group mode (ragged lengths: every key block of every sequence gets its
    partials; the partial buffers are not zero-filled)."""
    lens = (19, 45)
    hq, hk, d = 4, 1, 80
    g = torch.Generator().manual_seed(9)
    q, do = (torch.randn(sum(lens), hq, d, generator=g).half() for _ in range(2))
    k, v = (torch.randn(sum(lens), hk, d, generator=g).half() for _ in range(2))
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
    kw = dict(layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens),
              causal=True)
    o, lse = fwd(q, k, v, return_lse=True, config=C(32, 16, 4, 1, "ptr"), **kw)
    delta = ops_bwd.bwd_dot_do_o(o, do, layout="thd", cu_seqlens_q=cu, max_seqlen_q=max(lens))
    dq, _, dk, dv = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, delta, **kw,
                                     choice=(("triton", C(16, 16, 4, 1, "ptr", 64, 4)),
                                             ("triton", C(16, 16, 4, 1, "ptr", 64))))
    for i in range(len(lens)):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        ref, want = _grads(*(t[sl].transpose(0, 1)[None] for t in (q, k, v, do)), True)
        for name, x, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
            assert _rel(x[sl].transpose(0, 1)[None], w) < 4e-3, (i, name)


@pytest.mark.parametrize("fam,b,hq,hk,s,d,mask,want", [
    ("fwd", 4, 16, 16, 789, 160, "none", "_m64n64_w4_s2_tma_c128"),
    ("fwd", 5, 16, 1, 1000, 192, "top_left", "_m128n64_w8_s2_ptr_c128"),   # (buckets: <= 1024)
    ("fwd", 24, 8, 8, 1488, 80, "none", "_m128n64_w4_s3_tma_c64"),
    ("bwd_dq_dk_dv", 2, 16, 16, 4096, 256, "none", "_m64n64_w4_s2_kvsplit_dqm128n64w8s1"),
    ("bwd_dq_dk_dv", 4, 16, 16, 789, 160, "none", "_m64n64_w8_s2_ptr_c128_dqm128n64w8s1"),
    ("bwd_dq_dk_dv", 2, 16, 1, 3168, 64, "top_left", "_ptr_g16_"),
    ("bwd_dq_dk_dv", 1, 8, 1, 2156, 160, "none", "_ptr_c128_g8_"),
    ("bwd_dq_dk_dv", 20, 32, 8, 1201, 64, "top_left", "_gluon_dkdv_"),   # enough programs: no split
    ("bwd_dq_dk_dv", 2, 32, 8, 4096, 128, "top_left", "_gluon_dkdv_"),                     # Gluon kept
    ("bwd_dq_dk_dv", 1, 16, 2, 2048, 128, "top_left", "_ptr_g8_"),                         # Gluon gives way
])
def test_sm90_tables_pick_the_measured_variants(monkeypatch, fam, b, hq, hk, s, d, mask, want):
    """The shipped sm90 data (benchmarks/results/fmha_variants_probe.json) makes the heuristic pick the
    probe's winners (the forward of these head dims: the only enumerated tiles, whatever ranks them)."""
    from ck_fmha.backends.triton import keys as K
    from ck_fmha.heuristics import rank
    from ck_fmha.problem import FmhaProblem

    monkeypatch.setenv("TRITON_INTERPRET", "0")   # the Hopper choice, as on the GPU
    arch = _sm90()
    ks = K.enumerate_keys(arch, "triton", {"hdims": [(d, d)], "families": [fam], "dtypes": ["bf16"]})
    p = FmhaProblem(family=fam, batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=s, seqlen_k=s, hdim_q=d, dtype="bf16",
                    mask=mask, deterministic=True)
    cands = [k for k in ks if K.supports(k, p) is None]
    if fam == "fwd":
        assert cands and all(k.algorithm.dchunk for k in cands), [k.name for k in cands]   # chunked tiles only
    assert want in rank(p, cands, arch)[0].name


def test_group_split_backward_is_all_launches():
    """A group-split backward is Triton launches only (the partial sums are a kernel, not a torch op), so the
    public API's warm calls can replay it: recorded and replayed on fresh inputs it gives the general path's
    gradients."""
    from ck_fmha.backends.triton import warm as recorded

    b, hq, hk, s, d = 1, 4, 1, 21, 32
    q, k, v = _qkv(b, hq, hk, s, d, d, 31)
    do = torch.randn(b, hq, s, d, generator=torch.Generator().manual_seed(6)).half()
    o, lse = fwd(q, k, v, return_lse=True, config=C(32, 16, 4, 1, "ptr"))
    delta = ops_bwd.bwd_dot_do_o(o, do)
    choice = (("triton", C(16, 16, 4, 1, "ptr", 0, 4)), ("triton", C(16, 16, 4, 1, "ptr")))
    calls = []

    def via(fn, grid):
        launch = fn[grid]

        def run(*a, **kw):
            calls.append(getattr(fn, "__name__", ""))
            return launch(*a, **kw)
        return recorded.wrap(fn, grid, run)

    t = dict(q=q, k=k, v=v, do=do, lse=lse, d=delta)
    with recorded.recording() as recs:
        dq, _, dk, dv = ops_bwd.bwd_dq_dk_dv(q, k, v, do, lse, delta, choice=choice, _via=via)
    assert calls.count("fmha_bwd_sum_partials_kernel") == 2
    _, want = _grads(q, k, v, do, False)
    for x, w in zip((dq, dk, dv), want):
        assert _rel(x, w) < 4e-3
    if any(r is None for r in recs):   # (the interpreter records no launch: the replay is checked on a GPU only)
        return
    f = recorded.replayer(t, dict(dq=dq, dk=dk, dv=dv), recs, scratch=True)
    assert f is not None
    got = f(*t.values())
    for name, w in zip(("dq", "dk", "dv"), want):
        assert _rel(got[name], w) < 4e-3, name
