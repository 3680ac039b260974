"""One path for FMHA: the Dispatcher's plan picks what the launchers picked before (the tables'
tile, the Gluon kernels, the TMA form, the dQ pass), the launchers run exactly the plan's keys, and
``ck_fmha.attention`` is a custom op that torch.compile traces."""
import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, api  # noqa: E402
from ck_core.plugins import get_manager  # noqa: E402
from ck_core.registry import Registry  # noqa: E402

import ck_fmha  # noqa: E402
from ck_fmha import triton_keys as T  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402
from ck_fmha.triton import configs as C  # noqa: E402
from ck_fmha.triton import gluon_bwd  # noqa: E402

# -- the launcher's policy before the change, written out from ops.fwd / ops.bwd_dq_dk_dv ---------


def _rb(p):
    return p.mask != "none" and p.window_right >= 0


def _old_gluon_fwd_ok(p, cfg):
    causal = p.mask != "none" and p.window_left < 0 and p.window_right == 0
    return (not p.is_group and p.dtype in ("fp16", "bf16") and p.hdim_q == p.hdim_v and p.hdim_q in (64, 128)
            and cfg.BLOCK_M == 128 and cfg.num_warps == 12 and p.seqlen_q and p.seqlen_k
            and (p.mask == "none" or causal) and not p.logits_soft_cap and p.bias == "none" and not p.p_drop
            and p.seqlen_q % 128 == 0 and p.seqlen_k % cfg.BLOCK_N == 0 and (not causal or p.seqlen_q == p.seqlen_k))


def old_fwd(p, hopper):
    tag = "sm90" if hopper else "generic"
    v_trans = p.dtype == "fp8"   # NVIDIA and the interpreter
    kw = dict(causal=_rb(p), seqlen=p.seqlen_q, fp8=v_trans)
    cfg = C.default_fwd_config(p.hdim_q, p.hdim_v, tag, **kw)
    if cfg.variant in C.GLUON_VARIANTS:
        if hopper and _old_gluon_fwd_ok(p, cfg):
            return cfg
        cfg = C.default_fwd_config(p.hdim_q, p.hdim_v, tag, gluon=False, **kw)
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
            and p.seqlen_q and p.seqlen_q % 128 == 0 and p.seqlen_k % block_n == 0
            and (not causal or p.seqlen_q == p.seqlen_k))


def old_bwd(p, hopper):
    """((dK/dV kind, tile), dQ choice) of the old ops.bwd_dq_dk_dv default path."""
    d, sq, sk = p.hdim_q, p.seqlen_q, p.seqlen_k
    cfg_kv, cfg_q = C.default_bwd_configs(d, p.hdim_v, causal=_rb(p))
    gluon_ok = hopper and not p.dbias and _old_gluon_bwd_ok(p)
    det, fused = p.deterministic, None
    if not det and gluon_ok:
        fused = C.gluon_fused_tile(d, p.is_causal)
        if fused is not None and sk < C.gluon_fused_min_seqlen():
            fused = None
        if fused is None:
            det = True
    gk = None if p.dbias else (C.gluon_dkdv_tile(d, p.is_causal) if det else fused)
    gluon_kv = gk is not None and gluon_ok and sk % 128 == 0 and sq % gk[0] == 0
    kv = ("gluon", gk) if gluon_kv else ("triton", cfg_kv)
    if not det:
        return kv, ("atomic",)
    gt = C.gluon_dq_tile(d)
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
    kv = (("gluon", (alg.block_m, alg.num_stages, alg.variant.endswith("_pers"))) if alg.variant != "ptr"
          else ("triton", alg.config()))
    return kv, T.parse_dq(alg.dq)


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


def test_names_round_trip_with_the_dq_field():
    arch = get_manager().arch("sm90")
    keys = T.enumerate_keys(arch, "triton", {"families": ["bwd_dq_dk_dv", "fwd"], "dtypes": ["fp16"]})
    assert any(k.algorithm.variant in T.GLUON_BWD_VARIANTS for k in keys)
    for k in keys:
        assert T.legal(k, arch) is None
        assert T.parse_name(T.format_name(k.signature, k.algorithm))[1] == k.algorithm
    assert gluon_bwd.DQ_TILES   # the forced tiles stay reachable through the enumeration


# -- the launchers run exactly the plan's keys ------------------------------------------------------

_KERNELS = {"fmha_fwd_kernel": "fwd", "fmha_bwd_dq_dk_dv_kernel": "dkdv", "fmha_bwd_dq_kernel": "dq",
            "fmha_bwd_dot_do_o_kernel": "dot", "fmha_bwd_convert_dq_kernel": "convert"}


@pytest.fixture
def launched(monkeypatch):
    """(kernel, meta-parameters) of every Triton FMHA kernel launch."""
    from ck_fmha.triton import kernels as K
    from ck_fmha.triton import ops

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
    assert ops.K is K
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
    q = torch.randn(19, 2, 32, generator=g, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(19, 2, 32, generator=g, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(19, 2, 32, generator=g, dtype=torch.bfloat16, requires_grad=True)
    o = ck_fmha.attention(q, k, v, causal=True, layout="thd", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=14,
                          max_seqlen_k=14, deterministic=False)
    o.sum().backward()
    runs = ck_dispatch_log.take()
    assert [r[0].mode for r in runs] == ["group", "group"]
    _check(runs, launched)
    assert torch.isfinite(q.grad).all()
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
