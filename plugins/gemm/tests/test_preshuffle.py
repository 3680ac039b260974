"""Pre-shuffled B (CK's preshuffle GEMM): packing, keys and names, enumeration, selection, and
``ck_gemm.preshuffle`` + ``ck_gemm.linear`` on the numpy backend and the Triton interpreter, each
against a float64 product of the weight *before* packing (written here from the math)."""
import os

import attrs
import numpy as np
import pytest

from ck_core.errors import ConfigError, InvalidProblem, MissingKernel
from ck_core.registry import Registry
from ck_gemm import GemmProblem
from ck_gemm.keys import PRESHUFFLE_VARIANTS, parse_name, preshuffle_violation, supports, supports_many
from ck_gemm.problem import pack_b, unpack_b


def _odd(rng, lo=5, hi=60):
    return int(rng.integers(lo, hi)) * 2 + 1


# -- packing --------------------------------------------------------------------------------------

@pytest.mark.parametrize("tn,tk", [(16, 16), (64, 32), (128, 64)])
def test_pack_puts_each_tile_in_one_contiguous_block(ck_rng, tn, tk):
    torch = pytest.importorskip("torch")
    n, k = _odd(ck_rng), _odd(ck_rng)
    w = ck_rng.standard_normal((n, k)).astype(np.float32)
    p = pack_b(w, tn, tk)
    nt, kt = -(-n // tn), -(-k // tk)
    assert p.shape == (nt, kt, tn, tk) and p.flags.c_contiguous
    flat = p.reshape(-1)
    for i in range(nt):
        for j in range(kt):
            block = flat[(i * kt + j) * tn * tk:(i * kt + j + 1) * tn * tk].reshape(tn, tk)
            want = np.zeros((tn, tk), np.float32)
            part = w[i * tn:(i + 1) * tn, j * tk:(j + 1) * tk]
            want[:part.shape[0], :part.shape[1]] = part
            assert np.array_equal(block, want)
    assert np.array_equal(unpack_b(p, n, k), w)
    assert np.array_equal(pack_b(torch.from_numpy(w), tn, tk).numpy(), p)   # torch packs the same


def test_problem_rules():
    ok = GemmProblem(3, 5, 7, preshuffle=True, pack_n=64, pack_k=32)
    assert ok.packed and ok.shape_b() == (1, 1, 64, 32)
    assert "preshuffle" in ok.bucket() and "preshuffle" not in GemmProblem(3, 5, 7).bucket()
    for bad in (dict(layout="rrr"), dict(batch=2), dict(pack_n=64), dict(pack_n=48, pack_k=32),
                dict(pack_n=64, pack_k=8)):
        with pytest.raises(InvalidProblem):
            GemmProblem(3, 5, 7, **{"preshuffle": True, **bad})
    with pytest.raises(InvalidProblem, match="preshuffle=True"):
        GemmProblem(3, 5, 7, pack_n=64, pack_k=32)
    with pytest.raises(InvalidProblem, match="no pack tile"):
        GemmProblem(3, 5, 7, preshuffle=True).shape_b()
    assert GemmProblem.from_dict(ok.to_dict()) == ok


# -- keys, names, enumeration ---------------------------------------------------------------------

def _sets(arch="gfx942", backend="numpy", **kw):
    return Registry.from_enumeration("gemm", arch, backend, dtypes=["fp16"], layouts=["rcr", "rrr"], **kw)


def test_variants_enumerate_standard_preshuffle_and_multi_d():
    std = _sets()
    assert len(std) == len(_sets(variants=["standard"]))           # the default set, unchanged
    ps = _sets(variants=["preshuffle"])
    md = _sets(variants=["multi_d"])
    every = _sets(variants=["standard", "preshuffle", "multi_d"])
    assert len(every) == len(std) + len(ps) + len(md)
    assert len(md) == 2 * len(std)                                  # one D, two Ds
    assert {k.signature.num_d for k in md} == {1, 2}
    assert len(_sets(variants="multi_d", num_ds=[0, 3])) == len(std)   # the num_ds given (the D ones)
    for k in ps:
        s, a = k.signature, k.algorithm
        assert s.preshuffle and s.layout == "rcr" and a.variant in PRESHUFFLE_VARIANTS
        assert a.split_k == 1 or a.variant == "tile"
        assert a.pad_m and a.pad_n and a.pad_k and k.name.endswith("_preshuffle." + k.arch + ".numpy")
    assert not any(k.signature.preshuffle for k in std) and not any("preshuffle" in k.name for k in std)
    # every all-padded rcr standard algorithm has its pre-shuffled twin
    twins = {k.algorithm for k in std if k.signature.layout == "rcr" and k.algorithm.pad_m and k.algorithm.pad_n
             and k.algorithm.pad_k}
    assert {k.algorithm for k in ps} == twins
    with pytest.raises(ConfigError, match="variants"):
        _sets(variants=["preshufle"])
    assert not len(Registry.from_enumeration("gemm", "gfx942", "ck", dtypes=["fp16"], variants=["preshuffle"]))


def test_cli_lists_the_variants(capsys):
    from ck_core.cli import main

    def count(*extra):
        assert main(["list", "gemm", "--arch", "gfx942", "--dtypes", "fp16", "--layouts", "rcr", *extra,
                     "--count"]) == 0
        return int(capsys.readouterr().out)

    std, ps, md = count(), count("--variants", "preshuffle"), count("--variants", "multi_d")
    assert count("--variants", "standard", "preshuffle", "multi_d") == std + ps + md > std
    assert count("--variants", "standard,preshuffle") == std + ps


def test_names_round_trip(ck_rng):
    keys = list(_sets(variants=["preshuffle", "multi_d"], activations=["none", "gelu"]))
    for i in ck_rng.choice(len(keys), size=min(200, len(keys)), replace=False):
        k = keys[int(i)]
        body = k.name.split(".")[0]
        sig, alg = parse_name(body)
        assert (sig, alg) == (k.signature, k.algorithm), body
    reg = Registry("gfx942", keys[:50])
    assert [k.name for k in Registry.from_dict(reg.to_dict())] == [k.name for k in keys[:50]]
    from ck_core.plugins import get_manager

    legal, arch = get_manager().op("gemm").legal, get_manager().arch("gfx942")
    k = next(k for k in keys if k.signature.preshuffle)
    assert legal(k, arch) is None
    assert "rcr only" in legal(attrs.evolve(k, signature=attrs.evolve(k.signature, layout="rrr")), arch)
    # split-K: on the one-tile-a-program variant as the plain keys have it, never in a persistent loop
    assert "split" in (legal(attrs.evolve(k, algorithm=attrs.evolve(k.algorithm, variant="persistent", split_k=2)),
                             arch) or "")
    assert preshuffle_violation(k.signature, attrs.evolve(k.algorithm, variant="tile", split_k=2)) is None
    with pytest.raises(MissingKernel, match="unknown token"):
        parse_name(k.name.split(".")[0] + "_preshufle")


def test_supports_pins_the_pack_tile(ck_rng):
    keys = tuple(_sets(variants=["standard", "preshuffle"], arch="sm90", backend="triton"))
    for _ in range(6):
        m, n, k = _odd(ck_rng, 1, 300), _odd(ck_rng, 1, 300), _odd(ck_rng, 1, 300)
        a = keys[int(ck_rng.integers(len(keys)))].algorithm
        for p in (GemmProblem(m, n, k), GemmProblem(m, n, k, preshuffle=True),
                  GemmProblem(m, n, k, preshuffle=True, pack_n=a.tile_n, pack_k=a.tile_k)):
            one = np.array([supports(key, p) is None for key in keys])
            assert np.array_equal(one, supports_many(keys, p))
            for key in np.array(keys)[one]:
                assert key.signature.preshuffle == p.preshuffle
                if p.pack_n:
                    assert (key.algorithm.tile_n, key.algorithm.tile_k) == (p.pack_n, p.pack_k)
            assert one.any()


# -- through the public API -----------------------------------------------------------------------

torch = pytest.importorskip("torch")
BACKENDS = ["numpy", pytest.param("triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors run triton kernels only in the interpreter"))]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch, ck_dispatch_log):
    pytest.importorskip("triton") if request.param == "triton" else None
    monkeypatch.setenv("CK_BACKEND", request.param)
    return request.param


# Triton 3.6's interpreter returns garbage for a bf16 tl.dot (see test_gemm_triton_dispatch.py):
# bf16 runs on the numpy backend here and on the GPU (benchmarks/gemm_tail_check.py)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_linear_with_a_preshuffled_weight(backend, dtype, ck_dispatch_log, ck_rng):
    import ck_gemm

    if backend == "triton" and dtype == "bf16":
        pytest.skip("the Triton interpreter's bf16 dot is broken; the numpy backend and the GPU probe cover bf16")
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    n, k = _odd(ck_rng), _odd(ck_rng)
    w = (torch.rand(n, k, generator=g) * 2 - 1).to(tdt)
    bias = (torch.rand(n, generator=g) * 2 - 1).to(tdt)
    pw = ck_gemm.preshuffle(w, m=int(ck_rng.integers(1, 300)))
    tn, tk = pw.tile
    assert pw.shape == (n, k) and tuple(pw.data.shape) == (-(-n // tn), -(-k // tk), tn, tk)
    ck_dispatch_log.take()
    tol = {"fp16": 3e-3, "bf16": 2e-2, "fp32": 1e-5}[dtype]
    for lead in ((_odd(ck_rng, 1, 40),), (2, _odd(ck_rng, 1, 20))):
        x = (torch.rand(*lead, k, generator=g) * 2 - 1).to(tdt)
        want = x.double() @ w.double().T          # the weight before packing, in float64
        for b in (None, bias):
            for _ in range(2):                     # the cold call, then the warm one
                y = ck_gemm.linear(x, pw, b)
                ref = want + (0 if b is None else b.double())
                assert y.shape == (*lead, n) and y.dtype == tdt
                assert float((y.double() - ref).norm() / ref.norm()) < tol
    runs = ck_dispatch_log.take()
    assert runs and all(p.preshuffle and (p.pack_n, p.pack_k) == (tn, tk) for p, _, _ in runs)
    assert all(all(name.split(".")[0].endswith("_preshuffle") for name in launched) for _, _, launched in runs)


def test_linear_refuses_what_a_packed_weight_cannot_do(ck_dispatch_log):
    import ck_gemm

    w = torch.rand(24, 40)
    pw = ck_gemm.preshuffle(w)
    with pytest.raises(InvalidProblem, match="in_features"):
        ck_gemm.linear(torch.rand(3, 41), pw)
    with pytest.raises(InvalidProblem, match="agree"):
        ck_gemm.linear(torch.rand(3, 40, dtype=torch.float64), pw)
    with pytest.raises(InvalidProblem, match="no_grad"):
        ck_gemm.linear(torch.rand(3, 40, requires_grad=True), pw)
    with pytest.raises(InvalidProblem, match="bias"):
        ck_gemm.linear(torch.rand(3, 40), pw, torch.rand(23))
    with pytest.raises(InvalidProblem, match="2-D"):
        ck_gemm.preshuffle(torch.rand(2, 3, 4))
    with pytest.raises(InvalidProblem, match="contiguous tensor of shape"):
        ck_gemm.PackedWeight(pw.data[:, :1], pw.tile, pw.shape)
    with torch.no_grad():
        assert ck_gemm.linear(torch.rand(3, 40, requires_grad=True), pw).shape == (3, 24)


_AOT = """
import json
from triton.backends.compiler import GPUTarget
from ck_gemm.backends.triton import GemmConfig, kernel_for, smem_bytes
out = []
for v, sk in (("plain", 1), ("persistent", 1), ("plain", 2), ("tma", 2), ("tma_persistent", 1),
              ("tma_persistent_cs", 1)):
    cfg = GemmConfig(64, 128, 64, 8, 4, 3, v, sk)
    spec = kernel_for(cfg, num_sms=132, dtype="bf16", layout="rcr", num_d=1, activation="relu", preshuffle=True)
    k = spec.compile(GPUTarget("cuda", 90, 32))
    out.append([v, k.metadata.shared, smem_bytes(cfg, "bf16"), "wgmma" in k.asm["ptx"]])
print("RESULT" + json.dumps(out))
"""


def test_preshuffle_kernels_compile_for_sm90_ahead_of_time():
    """The pre-shuffled-B kernels compile for Hopper (wgmma), within the shared-memory model."""
    import json
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    p = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT")][-1][len("RESULT"):])
    # then split over K, and the descriptor reads of the packed tile rows
    assert [r[0] for r in rows] == ["plain", "persistent", "plain", "tma", "tma_persistent", "tma_persistent_cs"]
    for v, shared, est, wgmma in rows:
        assert shared <= est and wgmma, (v, shared, est)


@pytest.mark.parametrize("variant,split_k,act,bias", [("plain", 2, None, False), ("plain", 3, "relu", True),
                                                     ("tma", 1, "relu", True), ("tma", 2, None, True),
                                                     ("tma_persistent", 1, None, False), ("tma_cs", 1, "relu", True),
                                                     ("tma_persistent_cs", 1, None, True)])
def test_split_k_and_tma_preshuffled_kernels_match_float64(variant, split_k, act, bias, ck_rng):
    """The pre-shuffled kernels split over K (raw partials, then the reduce pass's epilogue) and
    read by tensor descriptors (B's packed tile rows), odd M and N (K a multiple of 8: A's
    descriptor), against float64 of the weight before packing; C poisoned first."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("CPU tensors run triton kernels only in the interpreter")
    from ck_gemm.backends.triton import GemmConfig, gemm

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 31)))
    m, n, k = _odd(ck_rng, 1, 40), _odd(ck_rng, 1, 70), _odd(ck_rng, 60, 140)
    if variant != "plain":
        k = 8 * (k // 8)
    if variant.endswith("_cs"):   # C stored by descriptor: 16-byte rows
        n = 8 * (n // 8 + 1)
    cfg = GemmConfig(16, 32, 16, 1, 4, 2, variant, split_k)
    if variant == "tma_persistent_cs":
        cfg = cfg.evolve(epi_subtile=2)   # C stored in two N slices
    a = (torch.rand(m, k, generator=g) * 2 - 1).half().to(dev)
    w = (torch.rand(n, k, generator=g) * 2 - 1).half().to(dev)
    d = (torch.rand(n, generator=g) * 2 - 1).half().to(dev)
    c = torch.full((m, n), float("nan"), dtype=torch.float16, device=dev)
    launched = []

    def rec(spec, vals, M, N, batch, name):
        launched.append(name)
        from ck_gemm.backends.triton.launch import _launch
        _launch(spec, vals, M, N, batch, name)

    gemm(a, pack_b(w, 32, 16), layout="rcr", config=cfg, c=c, d_tensors=(d.expand(m, n),) if bias else (),
         activation=act, packed_n=n, launch=rec)
    ref = a.double().cpu() @ w.double().cpu().T + (d.double().cpu() if bias else 0)
    ref = torch.relu(ref) if act else ref
    out = c.double().cpu()
    assert len(launched) == (2 if split_k > 1 else 1) and launched[-1].endswith("/reduce") == (split_k > 1)
    assert torch.isfinite(out).all() and float((out - ref).norm() / ref.norm()) < 3e-3


def test_preshuffled_space_holds_the_plain_winners_split_k_twins():
    """sm90: the pre-shuffled keys include split-K on the tile variant and the twins of the
    tuned winners (rcr pointer variants), so a skinny packed linear may split K as the plain
    weight's pick does."""
    from ck_gemm.heuristics import tuned_keys
    from ck_core.plugins import get_manager

    arch = get_manager().arch("sm90")
    ps = list(Registry.from_enumeration("gemm", "sm90", "triton", dtypes=["fp16"], layouts=["rcr"],
                                        variants=["preshuffle"]))
    assert all(k.signature.preshuffle for k in ps)
    assert any(k.algorithm.split_k > 1 and k.algorithm.variant == "tile" for k in ps)
    algs = {k.algorithm for k in ps}
    want = {k.algorithm for k in tuned_keys(arch, "triton", ["fp16"], ["rcr"])
            if preshuffle_violation(attrs.evolve(k.signature, preshuffle=True), k.algorithm) is None}
    assert want and want <= algs
    legal = get_manager().op("gemm").legal
    assert all(legal(k, arch) is None for k in ps)
    from ck_core import Dispatcher
    plain = Dispatcher(Registry.from_enumeration("gemm", "sm90", "triton", dtypes=["fp16"], layouts=["rcr"]),
                       backend="triton")
    packed = Dispatcher(Registry("sm90", ps), backend="triton")
    assert packed.select(GemmProblem(1, 12288, 4096, preshuffle=True)).algorithm.split_k > 1
    # the same ranking: the packed pick is the plain pick's twin (skinny split-K, mid-M TMA,
    # large-M persistent TMA with a descriptor-stored C)
    for m, n, k in ((1, 12288, 4096), (16, 4096, 4096), (128, 12288, 4096), (512, 12288, 4096)):
        want = plain.select(GemmProblem(m, n, k)).algorithm
        assert packed.select(GemmProblem(m, n, k, preshuffle=True)).algorithm == want, (m, n, k)
