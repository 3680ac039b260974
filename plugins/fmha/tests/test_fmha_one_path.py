"""One path for FMHA: the Dispatcher's plan picks what the launchers picked before (the tables'
tile, the Gluon kernels, the TMA form, the dQ pass), the launchers run exactly the plan's keys, and
``ck_fmha.attention`` is a custom op that torch.compile traces."""
import itertools

import attrs

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, api  # noqa: E402
from ck_core.plugins import get_manager  # noqa: E402
from ck_core.registry import Registry  # noqa: E402

import ck_fmha  # noqa: E402
from ck_fmha.backends.triton import keys as T  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402
from ck_fmha.backends.triton import configs as C  # noqa: E402
from ck_fmha import heuristics as tuning  # noqa: E402
from ck_fmha.backends.triton import gluon_bwd  # noqa: E402

# -- the launcher's policy before the change, written out from ops.fwd / ops_bwd.bwd_dq_dk_dv ---------


def _rb(p):
    return p.mask != "none" and p.window_right >= 0


def _old_gluon_fwd_ok(p, cfg):
    causal = p.mask != "none" and p.window_left < 0 and p.window_right == 0
    return (not p.is_group and p.dtype in ("fp16", "bf16") and p.hdim_q == p.hdim_v and p.hdim_q in (64, 128)
            and cfg.BLOCK_M == 128 and cfg.num_warps == 12 and p.seqlen_q and p.seqlen_k
            and (p.mask == "none" or causal) and not p.logits_soft_cap and p.bias == "none" and not p.p_drop
            and (not causal or p.seqlen_q == p.seqlen_k))   # (any lengths: ragged tails masked in the kernel)


def old_fwd(p, hopper):
    tag = "sm90" if hopper else "generic"
    v_trans = p.dtype == "fp8"   # NVIDIA and the interpreter
    kw = dict(causal=_rb(p), seqlen=p.seqlen_q, fp8=v_trans)
    cfg = tuning.default_fwd_config(p.hdim_q, p.hdim_v, tag, **kw)
    if cfg.variant in C.GLUON_VARIANTS:
        if hopper and _old_gluon_fwd_ok(p, cfg):
            return cfg
        cfg = tuning.default_fwd_config(p.hdim_q, p.hdim_v, tag, gluon=False, **kw)
    variant = cfg.variant if hopper else "ptr"
    if p.is_group and v_trans:
        variant = "ptr"
    pow2 = all(d & (d - 1) == 0 and d >= 16 for d in (p.hdim_q, p.hdim_v))
    if variant == "tma_host" and (p.is_group or not pow2):
        variant = "tma"
    es = 1 if p.dtype == "fp8" else 2
    if variant in ("tma", "tma_ws") and any(d * es % 16 or d * es < 16 for d in (p.hdim_q, p.hdim_v)):
        variant = "ptr"
    return cfg.with_(variant=variant)


def _old_gluon_bwd_ok(p, block_n=64):
    causal = p.is_causal
    return (not p.is_group and p.dtype in ("fp16", "bf16") and p.hdim_q == p.hdim_v and p.hdim_q in (64, 128)
            and (p.mask == "none" or causal) and not p.logits_soft_cap and p.bias == "none" and not p.p_drop
            and p.seqlen_q and p.seqlen_k
            and (not causal or p.seqlen_q == p.seqlen_k))


def _fit(p, cfg_kv, dq, cfg_q):
    """The dK/dV tile of the tables as the sm90 enumeration holds it (keys._fitted: fewer stages, then
    halved blocks, until the kernels' measured shared memory fits; the d256 2-stage atomic tile needs
    263168 B).  ``dq``: ("atomic",), or None for the tables' Triton dQ pass ``cfg_q``."""
    arch = get_manager().arch("sm90")
    dq_field = tuning.DQ_ATOMIC if dq else T.dq_triton(cfg_q)
    a = T.TritonFmhaAlg(cfg_kv.BLOCK_M, cfg_kv.BLOCK_N, cfg_kv.num_warps, cfg_kv.num_stages, cfg_kv.variant,
                        dq=dq_field, dchunk=cfg_kv.DCHUNK)
    f = T._fitted("bwd_dq_dk_dv", p.hdim_q, p.hdim_v, a, 2, arch.lds_bytes)
    return cfg_kv.with_(BLOCK_M=f.block_m, BLOCK_N=f.block_n, num_stages=f.num_stages)


def old_bwd(p, hopper):
    """((dK/dV kind, tile), dQ choice) of the old ops_bwd.bwd_dq_dk_dv default path."""
    d, sq, sk = p.hdim_q, p.seqlen_q, p.seqlen_k
    # the arch's tables (heuristics.bwd_want): sm90 has its own bwd_tuned, other archs read generic's
    tag = "sm90" if hopper else "generic"
    cfg_kv, cfg_q = tuning.default_bwd_configs(d, p.hdim_v, tag, causal=_rb(p))
    gluon_ok = hopper and not p.dbias and _old_gluon_bwd_ok(p)
    det, fused = p.deterministic, None
    if not det and gluon_ok:
        fused = tuning.gluon_fused_tile(d, p.is_causal, tag)
        if fused is not None and sk < tuning.gluon_fused_min_seqlen(tag):
            fused = None
        if fused is None:
            det = True
    gk = None if p.dbias else (tuning.gluon_dkdv_tile(d, p.is_causal, tag) if det else fused)
    gluon_kv = gk is not None and gluon_ok
    # session 8: a GQA group split over programs (the arch's bwd_gsplit rule, Hopper here): the Gluon kernel
    # gives way where its 128-key programs are under gluon_waves and the group would split
    rule = tuning.bwd_gsplit_rule(tag) if hopper else {}
    group = p.nhead_q // p.nhead_k

    def split(block_n, waves, parts=1):
        n, programs = 1, -(-(sk or 0) // block_n) * p.batch * p.nhead_k * parts
        while (n * 2 <= min(group, 16) and waves > 0 and programs * n < waves * 132
               and -(-group // (n * 2)) * (sq or 0) >= rule.get("min_rows", 0)):
            n *= 2
        return n

    if gluon_kv and split(128, rule.get("gluon_waves", 0)) > 1:
        gluon_kv = False
    if not gluon_kv and hopper:   # session 9: a tuned tile over the arch's shared memory: its nearest smaller form
        cfg_kv = _fit(p, cfg_kv, None if det else ("atomic",), cfg_q)
    if not gluon_kv:
        gs = split(cfg_kv.BLOCK_N, rule.get("waves", 0), 2 if cfg_kv.variant == "kvsplit" else 1)
        cfg_kv = cfg_kv.with_(GSPLIT=gs if gs > 1 else 0)
    kv = ("gluon", gk) if gluon_kv else ("triton", cfg_kv)
    if not det:
        return kv, ("atomic",)
    gt = tuning.gluon_dq_tile(d, tag)
    if hopper and gt is not None and _old_gluon_bwd_ok(p, gt[0]):
        return kv, ("gluon", gt)
    return kv, ("triton", cfg_q)


# -- the new plan ---------------------------------------------------------------------------------


def _dispatcher(arch, dtype):
    reg = Registry(arch, T.enumerate_keys(get_manager().arch(arch), "triton",
                                          {"families": ["fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"],
                                           "dtypes": [dtype]}))
    return Dispatcher(reg, backend="triton", check_backend=False)


def _new_bwd(alg):
    kv = (("gluon", (alg.block_m, alg.num_stages, alg.variant.endswith("_pers"))) if alg.variant.startswith("gluon")
          else ("triton", alg.config()))
    dq = T.parse_dq(alg.dq)
    if dq[0] == "triton":   # the key's head-dim chunk runs in the dQ pass too
        dq = ("triton", dq[1].with_(DCHUNK=alg.dchunk))
    return kv, dq


_MASKS = [dict(), dict(mask="top_left"), dict(mask="bottom_right"), dict(mask="top_left", window_left=8, window_right=0),
          dict(mask="bottom_right", window_left=16, window_right=16)]
_LENS = [(128, 128), (256, 256), (100, 77), (1024, 1024), (4096, 4096), (8192, 8192), (512, 640)]
_FEATS = [dict(), dict(logits_soft_cap=5.0), dict(bias="elementwise"), dict(p_drop=0.1)]


def _problems(family, dtypes):
    for dt, (hq, hv), mask, (sq, sk), feat in itertools.product(dtypes, T.HDIMS, _MASKS, _LENS, _FEATS):
        if dt == "fp8" and feat:
            continue
        base = dict(family=family, dtype=dt, batch=2, nhead_q=4, nhead_k=2, hdim_q=hq, hdim_v=hv, **mask, **feat)
        yield FmhaProblem(seqlen_q=sq, seqlen_k=sk, **base)
        if sq == sk and sq <= 1024 and not feat:   # group mode
            yield FmhaProblem(mode="group", seqstart_q=(0, sq // 2, sq), seqstart_k=(0, sk // 2, sk), **base)


@pytest.mark.parametrize("arch", ["sm90", "gfx942"])
def test_the_plan_picks_what_the_launcher_picked(arch, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")    # rank as on the GPU (nothing is launched here)
    hopper = arch == "sm90"
    n = 0
    for dtype in ("fp16", "bf16", "fp8") if hopper else ("fp16", "bf16"):
        disp = _dispatcher(arch, dtype)
        for p in _problems("fwd", (dtype,)):
            got = disp.plan(p).stages[0].key.algorithm
            assert got.config() == old_fwd(p, hopper), (p, got)
            n += 1
        if dtype == "fp8":
            continue
        for p in _problems("bwd_dq_dk_dv", (dtype,)):
            for det in (True, False):
                pb = FmhaProblem(**{**p.to_dict(), "deterministic": det})
                got = disp.plan(pb).stages[1].key.algorithm
                assert _new_bwd(got) == old_bwd(pb, hopper), (pb, got)
                n += 1
    assert n > 500


def test_deterministic_is_a_key_field(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    disp = _dispatcher("sm90", "bf16")
    base = dict(family="bwd_dq_dk_dv", dtype="bf16", batch=1, nhead_q=2, hdim_q=96, seqlen_q=200, seqlen_k=300)
    det = disp.plan(FmhaProblem(**base, deterministic=True)).stages[1].key
    fast = disp.plan(FmhaProblem(**base, deterministic=False)).stages[1].key
    assert det.algorithm.dq != "atomic" and fast.algorithm.dq == "atomic" and det.name != fast.name
    assert "not deterministic" in T.supports(fast, FmhaProblem(**base, deterministic=True))


def test_names_round_trip_with_the_splits_field():
    k = next(k for k in T.enumerate_keys(get_manager().arch("sm90"), "triton",
                                         {"family": "fwd_splitkv", "dtypes": "fp16", "hdims": [(64, 64)]})
             if k.algorithm.splits == 5)
    body = T.format_name(k.signature, k.algorithm)
    assert body.endswith("_k5") and T.parse_name(body) == (k.signature, k.algorithm)
    p = FmhaProblem(family="fwd_splitkv", batch=1, nhead_q=2, seqlen_q=1, seqlen_k=300, hdim_q=64, num_splits=3)
    assert "3" in T.supports(k, p) and T.supports(attrs.evolve(k, algorithm=attrs.evolve(k.algorithm, splits=3)),
                                                  p) is None


def test_names_round_trip_with_the_dq_field():
    arch = get_manager().arch("sm90")
    keys = T.enumerate_keys(arch, "triton", {"families": ["bwd_dq_dk_dv", "fwd"], "dtypes": ["fp16"]})
    assert any(k.algorithm.variant in T.GLUON_BWD_VARIANTS for k in keys)
    for k in keys:
        assert T.legal(k, arch) is None
        assert T.parse_name(T.format_name(k.signature, k.algorithm))[1] == k.algorithm
    assert gluon_bwd.tiles("dq", arch.name)   # the forced tiles stay reachable through the enumeration


# -- the launchers run exactly the plan's keys ------------------------------------------------------

_KERNELS = {"fmha_fwd_kernel": "fwd", "fmha_bwd_dq_dk_dv_kernel": "dkdv", "fmha_bwd_dq_kernel": "dq",
            "fmha_bwd_dot_do_o_kernel": "dot", "fmha_bwd_convert_dq_kernel": "convert"}


@pytest.fixture
def launched(monkeypatch):
    """(kernel, meta-parameters) of every Triton FMHA kernel launch."""
    from ck_fmha.backends.triton import kernels as K
    from ck_fmha.backends.triton import launch as ops
    from ck_fmha.backends.triton import launch_bwd as ops_bwd

    out = []

    class Spy:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            def call(*a, **kw):
                out.append((self.name, {k: kw.get(k) for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages",
                                                                "USE_TMA", "ATOMIC_DQ")}))
                return self.fn[grid](*a, **kw)
            return call

    for attr, name in _KERNELS.items():
        monkeypatch.setattr(K, attr, Spy(name, getattr(K, attr)))
    assert ops.K is K and ops_bwd.K is K
    return out


def _tile(alg):
    return {"BLOCK_M": alg.block_m, "BLOCK_N": alg.block_n, "num_warps": alg.num_warps, "num_stages": alg.num_stages}


def _check(runs, launched):
    """Each ck_after_run's names are the plan's keys, and the kernels launched are those keys' tiles."""
    keys = {}
    for problem, plan, names in runs:
        assert names == plan
        from ck_fmha.api import _dispatcher
        disp = _dispatcher(torch.ones(1), problem)
        keys.update({s.key.name: s.key for s in disp.plan(problem).stages})
    want = []
    for _, _, names in runs:
        for name in names:
            a, fam = keys[name].algorithm, keys[name].signature.family
            if fam == "fwd":
                want.append(("fwd", dict(_tile(a), USE_TMA=0, ATOMIC_DQ=None)))
            elif fam == "bwd_dot_do_o":
                want.append(("dot", None))
            elif fam == "bwd_dq_dk_dv":
                want.append(("dkdv", dict(_tile(a), USE_TMA=None, ATOMIC_DQ=a.dq == "atomic")))
                if a.dq != "atomic":
                    dq = T.parse_dq(a.dq)[1]
                    want.append(("dq", dict(BLOCK_M=dq.BLOCK_M, BLOCK_N=dq.BLOCK_N, num_warps=dq.num_warps,
                                            num_stages=dq.num_stages, USE_TMA=None, ATOMIC_DQ=None)))
            elif fam == "bwd_convert_dq" and any(keys[n].algorithm.dq == "atomic" for n in names):
                want.append(("convert", None))
    got = [(n, m if n in ("fwd", "dkdv", "dq") else None) for n, m in launched]
    assert got == want


@pytest.mark.parametrize("deterministic", [True, False])
def test_attention_launches_the_plan(ck_dispatch_log, launched, ck_rng, deterministic, monkeypatch):
    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    q = torch.randn(1, 17, 4, 32, generator=g, dtype=torch.float16, requires_grad=True)
    k = torch.randn(1, 23, 2, 32, generator=g, dtype=torch.float16, requires_grad=True)
    v = torch.randn(1, 23, 2, 32, generator=g, dtype=torch.float16, requires_grad=True)
    o = ck_fmha.attention(q, k, v, causal="bottom_right", layout="bshd", deterministic=deterministic)
    o.backward(torch.randn(o.shape, generator=g, dtype=o.dtype))
    o2 = ck_fmha.attention_forward(q, k, v, layout="bshd")
    runs = ck_dispatch_log.take()
    assert [r[0].family for r in runs] == ["fwd", "bwd_dq_dk_dv", "fwd"]
    _check(runs, launched)
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.detach().double().transpose(1, 2).repeat_interleave(
        2 if i else 1, dim=1) for i, x in enumerate((q, k, v)))).transpose(1, 2)
    assert float((o2.double() - ref).norm() / ref.norm()) < 1e-2
    api.clear()


def test_group_mode_attention_launches_the_plan(ck_dispatch_log, launched, ck_rng, monkeypatch):
    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    cu = torch.tensor([0, 5, 19], dtype=torch.int32)
    q = torch.randn(19, 2, 32, generator=g, dtype=torch.float16, requires_grad=True)
    k = torch.randn(19, 2, 32, generator=g, dtype=torch.float16, requires_grad=True)
    v = torch.randn(19, 2, 32, generator=g, dtype=torch.float16, requires_grad=True)
    o = ck_fmha.attention(q, k, v, causal=True, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=14,
                          max_seqlen_k=14, deterministic=False)
    o.sum().backward()
    runs = ck_dispatch_log.take()
    assert [r[0].mode for r in runs] == ["group", "group"]
    _check(runs, launched)
    assert torch.isfinite(q.grad).all()
    api.clear()


# -- decode: run-time key lengths, one plan per shape, the Dispatcher's split count -------------------


@pytest.fixture
def split_grids(monkeypatch):
    """(kernel, grid, meta-parameters) of every split-KV main / combine launch."""
    from ck_fmha.backends.triton import kernels as K

    out = []

    class Spy:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            def call(*a, **kw):
                out.append((self.name, tuple(grid), {k: kw.get(k) for k in ("BLOCK_M", "BLOCK_N", "num_warps",
                                                                           "num_stages")}))
                return self.fn[grid](*a, **kw)
            return call

    for attr, name in (("fmha_fwd_splitkv_kernel", "main"), ("fmha_fwd_splitkv_combine_kernel", "combine")):
        monkeypatch.setattr(K, attr, Spy(name, getattr(K, attr)))
    return out


def _ref_decode(q, k, v, lens, layout):
    """float64 bottom-right causal attention of q over each batch's first lens[b] keys ('bhsd' or 'bshd')."""
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    q, k, v = (x.double() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    out = torch.empty(q.shape[:3] + (v.shape[-1],), dtype=torch.float64)
    sq = q.shape[2]
    for b, n in enumerate(lens):
        s = q[b] @ k[b, :, :n].transpose(-1, -2) / q.shape[-1] ** 0.5
        i, j = torch.arange(sq)[:, None], torch.arange(n)[None, :]
        s = s.masked_fill(j > i + n - sq, float("-inf"))
        out[b] = torch.softmax(s, -1) @ v[b, :, :n]
    return out.transpose(1, 2) if layout == "bshd" else out


def _pages(k, v, ps, g):
    """k/v [B, Hk, S, D] scattered into a page pool [pages, ps, Hk, D] through a random block table."""
    b, hk, sk, d = k.shape
    npg = -(-sk // ps)
    table = torch.randperm(b * npg + 2, generator=g)[:b * npg].view(b, npg).to(torch.int32)
    kc = torch.full((b * npg + 2, ps, hk, d), float("nan"), dtype=k.dtype)
    vc = kc.clone()
    pad = lambda x: torch.nn.functional.pad(x, (0, 0, 0, npg * ps - sk))   # noqa: E731
    kp, vp = pad(k), pad(v)
    for bi in range(b):
        for pi in range(npg):
            kc[table[bi, pi]] = kp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
            vc[table[bi, pi]] = vp[bi, :, pi * ps:(pi + 1) * ps].transpose(0, 1)
    return kc, vc, table


@pytest.mark.parametrize("paged", [False, True])
def test_decode_steps_launch_the_plan(ck_dispatch_log, split_grids, ck_rng, paged, monkeypatch):
    """Decode steps with changing key lengths reuse one problem and plan (the lengths are a device
    tensor, not a problem field); the names ck_after_run reports are the plan's keys; the launches
    are those keys' tiles with the plan's split count; the output matches a float64 reference."""
    from ck_fmha import decode
    from ck_fmha.backends.triton import launch as ops

    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    b, hq, hk, sq, sk, d = 2, 4, 2, 1, 600, 32
    layout = "bshd" if paged else "bhsd"
    q = torch.randn(b, hq, sq, d, generator=g, dtype=torch.float16)
    k = torch.randn(b, hk, sk, d, generator=g, dtype=torch.float16)
    v = torch.randn(b, hk, sk, d, generator=g, dtype=torch.float16)
    qx = q.transpose(1, 2) if paged else q
    if paged:
        kc, vc, table = _pages(k, v, 16, g)
    outs, steps = [], [[600, 257], [3, 599], [1, 1]]
    for lens in steps:
        sl = torch.tensor(lens, dtype=torch.int32)
        if paged:
            outs.append(decode.paged_decode(qx, kc, vc, table, sl, causal=True, layout=layout))
        else:
            outs.append(decode.splitkv_decode(qx, k, v, seqlens_k=sl, causal=True, layout=layout))
    assert len(decode._PROBLEMS) == 1   # one signature: the steps differ only in the lengths tensor
    runs = ck_dispatch_log.take()
    assert len(runs) == len(steps) and len({r[0] for r in runs}) == 1
    p = runs[0][0]
    assert p.runtime_seqlens_k and p.seqlens_k is None and p.paged_kv == paged and p.seqlen_k >= sk
    disp = decode._dispatcher(q, p)
    stages = disp.plan(p).stages
    assert [s.name for s in stages] == ["fwd_splitkv", "fwd_splitkv_combine"]
    for _, plan, names in runs:
        assert names == plan == tuple(s.key.name for s in stages)
    # the count the heuristic layer chose, from the ArchSpec's compute units, is what launched
    from ck_fmha.heuristics import split_count
    assert p.num_splits == split_count(b * hk, p.seqlen_k, disp.arch.compute_units, query_rows=hq // hk * sq)
    main = stages[0].key.algorithm
    assert main.splits == p.num_splits and f"_k{p.num_splits}" in stages[0].key.name   # the count is a key field
    for name, grid, meta in split_grids:
        if name == "main":
            assert grid[0] == p.num_splits and grid[1] == b * hk
            assert meta == dict(_tile(main), BLOCK_M=max(16, main.block_m))
    assert [n for n, _, _ in split_grids] == ["main", "combine"] * len(steps)
    for lens, o in zip(steps, outs):
        ref = _ref_decode(q, k, v, lens, "bhsd")
        got = o.transpose(1, 2) if paged else o
        assert torch.isfinite(got).all()
        assert float((got.double() - ref).norm() / ref.norm()) < 1e-2
    api.clear()


def test_decode_explicit_splits_and_bad_lengths(ck_dispatch_log, split_grids, monkeypatch):
    """An explicit num_splits is the plan's count exactly (no rounding to key blocks); host
    lengths past the capacity are refused before a launch."""
    from ck_core.errors import InvalidProblem

    from ck_fmha import decode

    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 1, 32, generator=g, dtype=torch.float16)
    k = torch.randn(1, 2, 100, 32, generator=g, dtype=torch.float16)
    o = decode.splitkv_decode(q, k, k, num_splits=7)
    (p, names, _), = ck_dispatch_log.take()
    assert p.num_splits == 7 and not p.runtime_seqlens_k and "_k7." in names[0]
    assert [grid[0] for n, grid, _ in split_grids if n == "main"] == [7]
    assert float((o.double() - _ref_decode(q, k, k, [100], "bhsd")).abs().max()) < 1e-2
    with pytest.raises(InvalidProblem, match="capacity"):
        decode.splitkv_decode(q, k, k, seqlens_k=torch.tensor([101], dtype=torch.int32))
    with pytest.raises(InvalidProblem, match="num_splits"):
        decode.splitkv_decode(q, k, k, num_splits=0)
    api.clear()


@pytest.mark.parametrize("backend", ["triton", "numpy"])
def test_appendkv_steps_launch_the_plan(ck_dispatch_log, backend, monkeypatch):
    """appendkv writes the caches in place at run-time lengths; the steps share one plan, and the
    names ck_after_run reports are its key; both backends write the same caches."""
    from ck_fmha import decode
    from ck_fmha.backends.triton import launch as ops

    monkeypatch.setenv("CK_BACKEND", backend)
    api.clear()
    g = torch.Generator().manual_seed(11)
    b, hq, hk, sn, cap, d = 2, 4, 2, 3, 20, 32
    kc = torch.randn(b, hk, cap, d, generator=g, dtype=torch.float16)
    vc = torch.randn(b, hk, cap, d, generator=g, dtype=torch.float16)
    want_k, want_v = kc.clone(), vc.clone()
    for lens in ([0, 5], [17, 2]):
        q = torch.randn(b, hq, sn, d, generator=g, dtype=torch.float16)
        kn = torch.randn(b, hk, sn, d, generator=g, dtype=torch.float16)
        vn = torch.randn(b, hk, sn, d, generator=g, dtype=torch.float16)
        q_rot, k2, v2 = decode.appendkv(q, kn, vn, kc, vc, torch.tensor(lens, dtype=torch.int32))
        assert k2 is kc and v2 is vc and torch.equal(q_rot, q)   # rope='none': q_rot is a copy of q
        for bi, n in enumerate(lens):
            want_k[bi, :, n:n + sn], want_v[bi, :, n:n + sn] = kn[bi], vn[bi]
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    runs = ck_dispatch_log.take()
    assert len(runs) == 2 and runs[0][0] == runs[1][0] and runs[0][0].runtime_seqlens_k
    assert len(decode._PROBLEMS) == 1
    plan = tuple(s.key.name for s in decode._PROBLEMS[next(iter(decode._PROBLEMS))][1].plan(runs[0][0]).stages)
    assert all(names == p == plan for _, p, names in runs)
    from ck_core.errors import InvalidProblem
    with pytest.raises(InvalidProblem, match="capacity"):   # 18 + 3 new tokens overflow 20 slots
        decode.appendkv(q, kn, vn, kc, vc, torch.tensor([18, 0], dtype=torch.int32))
    api.clear()


@pytest.mark.parametrize("lookup", ["vllm", "sglang"])
def test_batch_prefill_launches_the_plan(ck_dispatch_log, lookup, monkeypatch):
    """batch_prefill: calls with other key lengths reuse one problem (the lengths are a device
    tensor); ck_after_run names the plan's key; the output matches a float64 reference."""
    from ck_fmha import prefill
    from ck_fmha.backends.triton import launch as ops

    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    g = torch.Generator().manual_seed(23)
    hq, hk, d, ps, cap = 2, 1, 32, 8, 40
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q = torch.randn(12, hq, d, generator=g, dtype=torch.float16)
    k = torch.randn(2, hk, cap, d, generator=g, dtype=torch.float16)
    v = torch.randn(2, hk, cap, d, generator=g, dtype=torch.float16)
    kc, vc, table = _pages(k, v, ps, g)
    npg = table.shape[1]
    tabs = (dict(block_table=table) if lookup == "vllm" else
            dict(kv_indptr=torch.arange(0, 3 * npg, npg, dtype=torch.int32), kv_page_indices=table.reshape(-1)))
    for lens in ([40, 9], [7, 33]):
        o = prefill.batch_prefill(q, kc, vc, torch.tensor(lens, dtype=torch.int32), cu_seqlens_q=cu, max_seqlen_q=7,
                              max_seqlen_k=cap, causal="bottom_right", **tabs)
        for bi, (a, z) in enumerate(((0, 5), (5, 12))):
            qb = q[a:z].transpose(0, 1)[None]
            ref = _ref_decode(qb, k[bi:bi + 1], v[bi:bi + 1], [lens[bi]], "bhsd")[0].transpose(0, 1)
            assert float((o[a:z].double() - ref).norm() / ref.norm()) < 1e-2
    runs = ck_dispatch_log.take()
    assert len(runs) == 2 and runs[0][0] == runs[1][0] and runs[0][0].runtime_seqlens_k
    (p, disp), = prefill._PROBLEMS.values()
    plan = tuple(s.key.name for s in disp.plan(p).stages)
    assert all(names == pl == plan for _, pl, names in runs)
    api.clear()


# -- torch.compile of a model using the three ops -----------------------------------------------------


def test_torch_compile_fullgraph_with_attention(ck_dispatch_log, ck_rng):
    pytest.importorskip("ck_gemm")
    pytest.importorskip("ck_conv")
    from ck_conv import conv2d
    from ck_gemm import linear

    F = torch.nn.functional

    class Net(torch.nn.Module):
        def __init__(self, ours):
            super().__init__()
            self.ours = ours
            self.w = torch.nn.Parameter(torch.randn(4, 2, 3, 3) * .3)
            self.lw = torch.nn.Parameter(torch.randn(3 * 32, 4) * .3)

        def forward(self, x):
            conv = conv2d if self.ours else F.conv2d
            y = torch.relu(conv(x, self.w, padding=1)).flatten(2).transpose(1, 2)   # [B, 16 tokens, 4]
            lin = linear if self.ours else F.linear
            qkv = lin(y, self.lw).reshape(y.shape[0], 16, 3, 1, 32).to(torch.float16 if self.ours else x.dtype)
            q, k, v = qkv.unbind(2)
            if self.ours:
                return ck_fmha.attention(q, k, v, causal=True, layout="bshd").float()
            return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                  is_causal=True).transpose(1, 2)

    torch.manual_seed(int(ck_rng.integers(1 << 31)))
    ours, ref = Net(True), Net(False).double()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(2, 2, 4, 4)
    out = torch.compile(ours, fullgraph=True, backend="aot_eager")(x)
    out.sum().backward()
    want = ref(x.double())
    want.sum().backward()
    rel = lambda a, b: float((a.detach().double() - b.detach()).norm() / b.detach().norm())  # noqa: E731
    assert rel(out, want) < 2e-2
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert rel(p.grad, q.grad) < 5e-2
    ops = [p.op for p, _, _ in ck_dispatch_log.take()]
    assert ops.count("fmha") == 2 and "conv" in ops and "gemm" in ops
