"""GEMM through the dispatcher on the GPU (run with CK_TEST_GPU=1 pytest -m gpu)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from ck_core import Dispatcher, Registry, get_manager  # noqa: E402
from ck_core.testing import check_against_reference  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402


def _gpu_arch():
    tb = get_manager().backend("triton")
    for a in get_manager().archs().values():
        if tb.can_execute(a)[0]:
            return a.name
    pytest.skip("no installed arch plugin describes this GPU")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["rcr", "rrr", "crr", "ccr"])
def test_dispatched_gemm_on_gpu(dtype, layout, ck_rng):
    arch = _gpu_arch()
    disp = Dispatcher(Registry.from_enumeration("gemm", arch, "triton", dtypes=[dtype], layouts=[layout]),
                      backend="triton")
    for m, n, k in [(257, 131, 199), (1024, 1000, 520), (16, 4096, 1024)]:
        p = GemmProblem(m=m, n=n, k=k, dtype=dtype, layout=layout)
        rep = check_against_reference(disp, p, ck_rng)
        assert rep.passed, (disp.select(p).name, str(rep))


def test_fused_epilogue_and_batch_on_gpu(ck_rng):
    arch = _gpu_arch()
    import attrs
    base = Registry.from_enumeration("gemm", arch, "triton", dtypes=["fp16"], layouts=["rcr"])
    epi = dict(num_d=2, d_op="add", activation="gelu")
    reg = Registry(arch, [attrs.evolve(k, signature=attrs.evolve(k.signature, **epi)) for k in base])
    disp = Dispatcher(reg, backend="triton")
    p = GemmProblem(m=300, n=260, k=130, batch=3, dtype="fp16", layout="rcr", **epi)
    assert check_against_reference(disp, p, ck_rng).passed


def test_warm_run_is_captured_in_a_cuda_graph(ck_rng):
    """The dispatcher's hot path launches without host syncs: it can be graph-captured."""
    arch = _gpu_arch()
    disp = Dispatcher(Registry.from_enumeration("gemm", arch, "triton", dtypes=["fp16"], layouts=["rcr"]),
                      backend="triton")
    p = GemmProblem(m=512, n=384, k=256, dtype="fp16")
    a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(384, 256, device="cuda", dtype=torch.float16)
    c = torch.empty(512, 384, device="cuda", dtype=torch.float16)
    disp.run(p, a, b, c=c)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        disp.run(p, a, b, c=c)
    c.fill_(float("nan"))
    a.copy_(torch.randn_like(a))
    g.replay()
    torch.cuda.synchronize()
    ref = a.float() @ b.float().t()
    assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("kind", ["pointer", "tma"])
def test_replayed_launch_follows_new_tensors(kind):
    """The warm path replays the compiled kernel: fresh operands at new addresses (and
    a reused address with new contents) must all give fresh, correct results, for
    pointer kernels and for TMA kernels whose tensor maps are cached per address."""
    arch = _gpu_arch()
    reg = Registry.from_enumeration("gemm", arch, "triton", dtypes=["bf16"], layouts=["rcr"])
    p = GemmProblem(m=320, n=272, k=192, dtype="bf16")
    keys = [k for k in reg.candidates(p, "triton") if k.algorithm.split_k == 1
            and k.algorithm.variant.startswith("tma") == (kind == "tma")]
    if not keys:
        pytest.skip(f"no {kind} kernel for {arch}")
    disp = Dispatcher(Registry(arch, keys[:1]), backend="triton")
    keep = []
    for i in range(6):
        a = torch.randn(320, 192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(272, 192, device="cuda", dtype=torch.bfloat16)
        c = torch.full((320, 272), float("nan"), device="cuda", dtype=torch.bfloat16)
        out = disp.run(p, a, b, c=c) if i % 2 else disp.run(p, a, b)
        ref = a.double() @ b.double().t()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (i, err, keys[0].name)
        if i < 3:
            keep.append((a, b))   # keep some alive: later ones land at new addresses
    a, b = keep[0]
    a.copy_(torch.randn_like(a))  # same address, new contents
    out = disp.run(p, a, b)
    ref = a.double() @ b.double().t()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
    # a wrong shape with a recorded problem is refused, not launched
    from ck_core.errors import CkError
    with pytest.raises(CkError):
        disp.run(p, torch.randn(300, 192, device="cuda", dtype=torch.bfloat16), b)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_preshuffled_weights_on_gpu(dtype, ck_rng):
    """Every pre-shuffled-B key of a few tiles (plain and persistent) against float64, through the
    Dispatcher, then ck_gemm.linear with a packed weight (cold, warm, in a CUDA graph)."""
    import ck_gemm
    from ck_gemm.problem import pack_b

    arch = _gpu_arch()
    reg = Registry.from_enumeration("gemm", arch, "triton", dtypes=[dtype], layouts=["rcr"], variants=["preshuffle"])
    assert len(reg)
    tiles = sorted({(k.algorithm.tile_n, k.algorithm.tile_k) for k in reg})
    for tn, tk in tiles[:3]:
        for m, n, k in [(257, 131, 199), (16, 4096, 1024), (1024, 1000, 520)]:
            p = GemmProblem(m=m, n=n, k=k, dtype=dtype, layout="rcr", preshuffle=True, pack_n=tn, pack_k=tk)
            for key in [key for key in reg if key.algorithm.tile_n == tn and key.algorithm.tile_k == tk][:4]:
                rep = check_against_reference(Dispatcher(Registry(arch, [key]), backend="triton"), p, ck_rng)
                assert rep.passed, (key.name, str(rep))
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(int(ck_rng.integers(1 << 31)))
    w = (torch.rand(4099, 1031, device="cuda", generator=g) - 0.5).to(tdt)
    b = (torch.rand(4099, device="cuda", generator=g) - 0.5).to(tdt)
    pw = ck_gemm.preshuffle(w, m=64)
    assert torch.equal(pw.data, pack_b(w, *pw.tile))
    x = (torch.rand(3, 37, 1031, device="cuda", generator=g) - 0.5).to(tdt)
    want = x.double() @ w.double().T
    with torch.no_grad():
        for bias in (None, b):
            ref = want + (0 if bias is None else bias.double())
            for _ in range(3):
                y = ck_gemm.linear(x, pw, bias)
                assert float((y.double() - ref).norm() / ref.norm()) < 2e-2
        out = ck_gemm.linear(x, pw)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ck_gemm.linear(x, pw)
        x.copy_((torch.rand(x.shape, device="cuda", generator=g) - 0.5).to(tdt))
        graph.replay()
        torch.cuda.synchronize()
        ref = x.double() @ w.double().T
        assert float((out.double() - ref).norm() / ref.norm()) < 2e-2
