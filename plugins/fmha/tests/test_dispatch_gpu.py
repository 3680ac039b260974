"""FMHA through the dispatcher on the GPU (CK_TEST_GPU=1 pytest -m gpu): plans vs the float64
reference, bf16, fp8 (e4m3 with per-tensor descales), and a group-mode forward captured in a CUDA
graph (no host sync)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from ck_core import Dispatcher, Registry, get_manager  # noqa: E402
from ck_core.testing import check_against_reference  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402


@pytest.fixture(scope="module")
def disp():
    tb = get_manager().backend("triton")
    arch = next((a.name for a in get_manager().archs().values() if tb.can_execute(a)[0]), None)
    if arch is None:
        pytest.skip("no installed arch plugin describes this GPU")
    return Dispatcher(Registry.from_enumeration("fmha", arch, "triton"), backend="triton")


BASE = dict(batch=2, nhead_q=8, nhead_k=2, seqlen_q=300, seqlen_k=333, hdim_q=128)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kw", [dict(family="fwd"), dict(family="fwd", mask="bottom_right"),
                                dict(family="fwd", hdim_q=64, mask="generic", window_left=50, window_right=7),
                                dict(family="fwd", hdim_q=192, hdim_v=128),
                                dict(family="fwd_splitkv", seqlen_q=1, seqlen_k=5000, num_splits=7),
                                dict(family="bwd_dq_dk_dv", seqlen_k=300, mask="top_left"),
                                dict(family="bwd_dq_dk_dv", seqlen_k=300, deterministic=True)])
def test_plans_on_gpu(disp, dtype, kw, ck_rng):
    p = FmhaProblem(**{**BASE, "dtype": dtype, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, (str(rep), [s.key.name for s in disp.plan(p).stages])


def test_paged_decode_on_gpu(disp, ck_rng):
    p = FmhaProblem(family="fwd_pagedkv", batch=3, nhead_q=8, nhead_k=2, seqlen_q=1, seqlen_k=2048,
                    seqlens_k=(2048, 777, 1), hdim_q=128, paged_kv=True, page_size=64, layout="bshd")
    assert check_against_reference(disp, p, ck_rng).passed


def test_group_mode_forward_replays_in_a_cuda_graph(disp, ck_rng):
    p = FmhaProblem(family="fwd", mode="group", batch=3, nhead_q=4, nhead_k=4, hdim_q=64,
                    seqstart_q=(0, 170, 170, 400), seqstart_k=(0, 290, 290, 600), mask="bottom_right")
    op = get_manager().op("fmha")
    inputs = op.make_inputs(p, ck_rng)
    t = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in inputs.items()}
    disp.run_dict(p, t)  # warm: compile, upload seqstarts once
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = disp.run_dict(p, t)
    t["q"].copy_(torch.randn_like(t["q"]))
    g.replay()
    torch.cuda.synchronize()
    ref = op.reference(p, {k: (v.cpu().numpy() if hasattr(v, "cpu") else v) for k, v in t.items()})
    got = out["o"].float().cpu().numpy()
    rel = np.linalg.norm(got - ref["o"]) / np.linalg.norm(ref["o"])
    assert rel < 1e-2, rel


def test_group_mode_forward_and_backward_replay_in_one_cuda_graph(disp, ck_rng):
    """Issue 5's no-host-sync promise: a whole varlen fwd + bwd is captured once and replayed."""
    import attrs

    pf = FmhaProblem(family="fwd", mode="group", batch=3, nhead_q=4, nhead_k=2, hdim_q=64, lse=True,
                     seqstart_q=(0, 170, 171, 400), seqstart_k=(0, 170, 171, 400), mask="top_left")
    pb = attrs.evolve(pf, family="bwd_dq_dk_dv", lse=False)
    op = get_manager().op("fmha")
    host = op.make_inputs(pb, ck_rng)
    t = {k: torch.from_numpy(np.ascontiguousarray(host[k])).cuda() for k in ("q", "k", "v", "do")}

    def step():
        f = disp.run_dict(pf, {n: t[n] for n in ("q", "k", "v")})
        b = disp.run_dict(pb, {"q": t["q"], "k": t["k"], "v": t["v"], "o": f["o"], "lse": f["lse"],
                               "do": t["do"]})
        return f, b

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f, b = step()
    t["q"].copy_(torch.randn_like(t["q"]))
    g.replay()
    torch.cuda.synchronize()
    cpu = {k: v.cpu().numpy() for k, v in t.items()}
    ref_f = op.reference(pf, cpu)
    ref_b = op.reference(pb, dict(cpu, o=f["o"].cpu().numpy(), lse=f["lse"].cpu().numpy()))
    for name, got, ref in (("o", f["o"], ref_f["o"]), ("dq", b["dq"], ref_b["dq"]),
                           ("dk", b["dk"], ref_b["dk"]), ("dv", b["dv"], ref_b["dv"])):
        got = got.float().cpu().numpy()
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert rel < 2e-2, (name, rel)


# -- fp8 e4m3 forward: per-tensor descales, P scaled onto the fp8 range, o in bf16 ----------------
FP8 = dict(dtype="fp8", scale_q=0.37, scale_k=1.9, scale_v=0.61)
#: rel l2 of o: P in e4m3 (2**-4 relative per element) and o in bf16 (~2.5e-2 in the interpreter)
FP8_TOL = 5e-2


def _fp8_check(disp, p, rng):
    """The dispatched fp8 forward against the float64 reference: rel l2 within FP8_TOL, then the
    elementwise fp8 tolerance of stages.tolerance (check_against_reference) on fresh inputs."""
    key = disp.select(p)
    assert key.signature.dtype == "fp8" and key.signature.family == "fwd", key.name
    op = get_manager().op("fmha")
    host = op.make_inputs(p, rng)
    ref = op.reference(p, host)
    t = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in host.items()}
    out = disp.run_dict(p, t)
    assert out["o"].dtype == torch.bfloat16
    got = out["o"].float().cpu().numpy()
    assert np.isfinite(got).all()
    rel = np.linalg.norm(got - ref["o"]) / np.linalg.norm(ref["o"])
    assert rel < FP8_TOL, (key.name, rel)
    if p.lse:
        lse, want = out["lse"].cpu().numpy(), ref["lse"]
        fin = np.isfinite(want)
        assert np.array_equal(np.isfinite(lse), fin)
        assert np.allclose(lse[fin], want[fin], rtol=1e-4, atol=1e-4)
    rep = check_against_reference(disp, p, rng)
    assert rep.passed, (str(rep), key.name)


@pytest.mark.parametrize("kw", [
    dict(),                                                              # d128: the tma_host default on sm90
    dict(mask="bottom_right", lse=True),
    dict(hdim_q=64, mask="generic", window_left=50, window_right=7, layout="bshd"),
    dict(hdim_q=192, hdim_v=128, mask="top_left"),
    dict(hdim_q=256, logits_soft_cap=30.0, seqlen_q=129, seqlen_k=77),
    dict(hdim_q=96, nhead_k=1, seqlen_q=1, seqlen_k=1001),              # MQA, one query row
    dict(vlayout="c", seqlen_k=336),                                     # column-major V: read as it is
    dict(vlayout="c", layout="bshd", mask="top_left"),                   # (Sk=333: no TMA, pointer loads)
])
def test_fp8_forward_on_gpu(disp, kw, ck_rng):
    _fp8_check(disp, FmhaProblem(**{**BASE, "family": "fwd", **FP8, **kw}), ck_rng)


@pytest.mark.parametrize("vlayout", ["r", "c"])
def test_fp8_group_mode_forward_on_gpu(disp, vlayout, ck_rng):
    p = FmhaProblem(family="fwd", mode="group", batch=3, nhead_q=8, nhead_k=2, hdim_q=128, lse=True,
                    seqstart_q=(0, 170, 171, 400), seqstart_k=(0, 290, 290, 611), mask="bottom_right",
                    vlayout=vlayout, **FP8)
    _fp8_check(disp, p, ck_rng)


def _fp8_dtype():
    """The e4m3 flavour of this GPU (e4m3fnuz on CDNA3, OCP e4m3fn elsewhere)."""
    if torch.version.hip and "gfx94" in torch.cuda.get_device_properties(0).gcnArchName:
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def _ref_fp8(q, k, v, ds, causal):
    """float64 reference on the dequantised inputs (CPU)."""
    q, k, v = (x.cpu().double() * d for x, d in zip((q, k, v), ds))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("variant", ["ptr", "tma", "tma_host"])
def test_fp8_ops_device_descales_in_a_cuda_graph(variant):
    """ck_fmha.backends.triton.fwd on fp8 tensors with device descale tensors: every variant, captured in a
    CUDA graph and replayed after the descales and q changed on the device (no host sync)."""
    from ck_fmha.backends.triton import TritonFmhaConfig, fwd

    if torch.version.hip and variant != "ptr":
        pytest.skip("the TMA variants are CUDA-only")
    f8 = _fp8_dtype()
    g = torch.Generator(device="cuda").manual_seed(7)
    b, h, hk, s, d = 2, 8, 2, 517, 128
    q, k, v = (torch.randn(b, n, s, d, device="cuda", generator=g).to(f8) for n in (h, hk, hk))
    ds = [torch.tensor([x], device="cuda") for x in (0.37, 1.9, 0.61)]
    cfg = TritonFmhaConfig(128, 64, 4, 2, variant)

    def run():
        return fwd(q, k, v, causal=True, config=cfg, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])

    o = run()
    torch.cuda.synchronize()
    rel = ((o.double().cpu() - _ref_fp8(q, k, v, (0.37, 1.9, 0.61), True)).norm()
           / _ref_fp8(q, k, v, (0.37, 1.9, 0.61), True).norm()).item()
    assert o.dtype == torch.bfloat16 and rel < FP8_TOL, rel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        og = run()
    ds[1].fill_(0.9)
    q.copy_(torch.randn(q.shape, device="cuda", generator=g).to(f8))
    graph.replay()
    torch.cuda.synchronize()
    want = _ref_fp8(q, k, v, (0.37, 0.9, 0.61), True)
    rel = ((og.double().cpu() - want).norm() / want.norm()).item()
    assert rel < FP8_TOL, rel


@pytest.mark.parametrize("variant", ["ptr", "tma", "tma_host"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "thd"])
def test_fp8_v_layouts_on_gpu(variant, layout):
    """fp8 forward with V channel-contiguous (fp8_v_trans=False), copied by fwd (True) and made
    key-contiguous ahead of time (v_key_major, no copy): the same attention; the last two are the
    same kernel on the same data, so bit-identical."""
    from ck_fmha.backends.triton import TritonFmhaConfig, fwd, is_key_major, v_key_major

    if torch.version.hip and variant != "ptr":
        pytest.skip("the TMA variants are CUDA-only")
    f8 = _fp8_dtype()
    g = torch.Generator(device="cuda").manual_seed(3)
    b, h, hk, s, d = 2, 8, 2, 400, 128
    kw = dict(causal=True, config=TritonFmhaConfig(128, 64, 4, 2, variant), q_descale=0.5, k_descale=1.5,
              v_descale=0.8, layout=layout)
    if layout == "thd":
        cu = torch.tensor([0, 150, 400], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(s, n, d, device="cuda", generator=g).to(f8) for n in (h, hk, hk))
        kw.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=250, max_seqlen_k=250)
    else:
        shp = (lambda n: (b, n, s, d)) if layout == "bhsd" else (lambda n: (b, s, n, d))
        q, k, v = (torch.randn(shp(n), device="cuda", generator=g).to(f8) for n in (h, hk, hk))
    vk = v_key_major(v, layout)
    assert is_key_major(vk, layout) and torch.equal(vk.float(), v.float())
    o_row = fwd(q, k, v, fp8_v_trans=False, **kw)
    o_cp = fwd(q, k, v, fp8_v_trans=True, **kw)
    o_vk = fwd(q, k, vk, **kw)
    torch.cuda.synchronize()
    assert torch.equal(o_cp, o_vk)
    rel = ((o_cp.double() - o_row.double()).norm() / o_row.double().norm()).item()
    assert rel < 1e-2, rel
