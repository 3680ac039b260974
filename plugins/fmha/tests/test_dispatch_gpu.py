"""FMHA through the dispatcher on the GPU (CK_TEST_GPU=1 pytest -m gpu): plans vs the float64
reference, bf16, and a group-mode forward captured in a CUDA graph (no host sync)."""
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
