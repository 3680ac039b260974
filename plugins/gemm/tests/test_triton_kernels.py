"""Triton GEMM kernels: interpreter correctness (CPU), AOT compilation for six targets, GPU check.

The interpreter tests run the real kernels under TRITON_INTERPRET=1 on torch
CPU tensors against a float64 reference.  TRITON_INTERPRET is read when the
kernels are decorated, so this module sets it before importing them; AOT
compilation needs real JITFunctions and therefore runs in a subprocess.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
_GPU = torch.cuda.is_available()
if not _GPU:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from ck_core.errors import InvalidProblem, UnsupportedProblem  # noqa: E402
from ck_gemm.backends.triton import (CONFIG_SPACE, TMA_VARIANTS, VARIANTS, GemmConfig, gemm, iter_configs,  # noqa: E402
                                     kernel_for, smem_bytes)
from ck_gemm.heuristics import pick_config  # noqa: E402
from ck_gemm.backends.triton import launch as _launch_mod  # noqa: E402

DEV = "cuda" if _GPU else "cpu"
GEMM_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = GEMM_ROOT.parents[1]
TARGETS = [("cuda", 90, 32), ("hip", "gfx942", 64), ("hip", "gfx90a", 64), ("hip", "gfx950", 64),
           ("hip", "gfx1100", 32), ("hip", "gfx1201", 32)]


def _stored(shape_logical, row_major, dtype, batch=None, gen=None):
    r, c = shape_logical
    shape = (r, c) if row_major else (c, r)
    if batch:
        shape = (batch,) + shape
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(DEV)


def _logical(t, row_major):
    t = t.double().cpu()
    return t if row_major else t.transpose(-1, -2)


def _reference(a, b, layout, ds=(), d_op="add", act=None):
    C = _logical(a, layout[0] == "r") @ _logical(b, layout[1] == "r")
    # D tensors are in C's stored orientation
    Cs = C if layout[2] == "r" else C.transpose(-1, -2)
    for d in ds:
        Cs = Cs + d.double().cpu() if d_op == "add" else Cs * d.double().cpu()
    f = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
         "sigmoid": torch.sigmoid, "tanh": torch.tanh}[act]
    return f(Cs)


def _rel(out, ref):
    out = out.double().cpu()
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


SMALL = GemmConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2)


def _shape_for(variant):
    # tensor descriptors need 16-byte aligned strides: every stored inner dim (M of a column-major
    # A too) a multiple of 8 (fp16); off-tile edges all the same
    return (56, 40, 24) if variant in TMA_VARIANTS else (37, 45, 29)


# ------------------------------------------------------------------ interpreter / GPU correctness
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", ["rcr", "rrr", "crr", "ccr"])
def test_layouts_variants(variant, layout):
    g = torch.Generator().manual_seed(hash((variant, layout)) % 2**31)
    M, N, K = _shape_for(variant)
    a = _stored((M, K), layout[0] == "r", torch.float16, gen=g)
    b = _stored((K, N), layout[1] == "r", torch.float16, gen=g)
    c = gemm(a, b, layout=layout, config=SMALL.evolve(variant=variant))
    assert c.shape == ((M, N) if layout[2] == "r" else (N, M))
    assert _rel(c, _reference(a, b, layout)) < 2e-3


@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu", "sigmoid", "tanh"])
def test_epilogue_activation_bias(act):
    g = torch.Generator().manual_seed(7)
    M, N, K = 33, 40, 27
    a = _stored((M, K), True, torch.float16, gen=g)
    b = _stored((K, N), False, torch.float16, gen=g)
    bias = torch.randn(N, generator=g).to(torch.float16).to(DEV)
    c = gemm(a, b, layout="rcr", config=SMALL, d_tensors=(bias,), activation=act)
    assert _rel(c, _reference(a, b, "rcr", (bias,), "add", act)) < 3e-3


@pytest.mark.parametrize("variant", ["plain", "tma_persistent"])
def test_multi_d_mul_add(variant):
    g = torch.Generator().manual_seed(3)
    M, N, K = (37, 48, 40)
    a = _stored((M, K), True, torch.float16, gen=g)
    b = _stored((K, N), True, torch.float16, gen=g)
    d0 = torch.randn(M, N, generator=g).to(torch.float16).to(DEV)
    d1 = torch.randn(M, 1, generator=g).to(torch.float16).to(DEV)   # broadcast over N
    for op in ("add", "mul"):
        c = gemm(a, b, layout="rrr", config=SMALL.evolve(variant=variant), d_tensors=(d0, d1), d_op=op,
                 activation="relu")
        assert _rel(c, _reference(a, b, "rrr", (d0, d1), op, "relu")) < 3e-3


@pytest.mark.parametrize("variant", ["plain", "persistent", "tma", "tma_persistent"])
def test_batched(variant):
    g = torch.Generator().manual_seed(11)
    B, (M, N, K) = 3, _shape_for(variant)
    a = _stored((M, K), True, torch.float16, batch=B, gen=g)
    b = _stored((K, N), False, torch.float16, batch=B, gen=g)
    d = torch.randn(B, M, N, generator=g).to(torch.float16).to(DEV)
    c = gemm(a, b, layout="rcr", config=SMALL.evolve(variant=variant), d_tensors=(d,))
    assert c.shape == (B, M, N)
    assert _rel(c, _reference(a, b, "rcr", (d,))) < 2e-3
    # a 2-D B is broadcast over the batch: pointer variants take it, TMA ones refuse (never swap kernels)
    if variant in TMA_VARIANTS:
        with pytest.raises(UnsupportedProblem, match="broadcast batch"):
            gemm(a, b[0], layout="rcr", config=SMALL.evolve(variant=variant))
    else:
        c2 = gemm(a, b[0], layout="rcr", config=SMALL.evolve(variant=variant))
        assert _rel(c2, _reference(a, b[0].expand(B, -1, -1), "rcr")) < 2e-3


# ------------------------------------------------------------------ C through a tensor descriptor
def _ran(monkeypatch):
    """Record the KernelSpec names gemm launches (to see which path it took)."""
    names = []
    real = _launch_mod._launch

    def spy(spec, vals, M, N, batch, name):
        names.append(spec.name)
        real(spec, vals, M, N, batch, name)
    monkeypatch.setattr(_launch_mod, "_launch", spy)
    return names


@pytest.mark.parametrize("variant", ["tma_cs", "tma_persistent_cs"])
@pytest.mark.parametrize("epi", [1, 2, 4])
@pytest.mark.parametrize("layout,shape", [("rcr", (67, 136, 96)), ("rcr", (5, 24, 16)), ("rrr", (37, 40, 24)),
                                          ("crr", (40, 72, 24))])
def test_c_desc_store(variant, epi, layout, shape, monkeypatch):
    # M and N that are not multiples of the tile: the descriptor clips the edge tiles
    # (a column-major A needs M % 8 == 0 to stay on descriptors)
    M, N, K = shape
    g = torch.Generator().manual_seed(M * 1000 + N + epi)
    a = _stored((M, K), layout[0] == "r", torch.float16, gen=g)
    b = _stored((K, N), layout[1] == "r", torch.float16, gen=g)
    cfg = GemmConfig(16, 64, 32, 2, 4, 2, variant, 1, epi)
    ran = _ran(monkeypatch)
    c = gemm(a, b, layout=layout, config=cfg)
    assert ran == [f"{cfg.name}_fp16_{layout}"]
    assert _rel(c, _reference(a, b, layout)) < 2e-3


@pytest.mark.parametrize("variant", ["tma_cs", "tma_persistent_cs"])
def test_c_desc_store_leaves_neighbours(variant):
    # C is a 37 x 40 window of a wider buffer: the 64-wide edge tile must not spill into it
    g = torch.Generator().manual_seed(21)
    M, N, K = 37, 40, 24
    a = _stored((M, K), True, torch.float16, gen=g)
    b = _stored((K, N), False, torch.float16, gen=g)
    buf = torch.full((M + 3, N + 24), 7.0, dtype=torch.float16, device=DEV)
    c = buf[1:M + 1, 8:N + 8]
    gemm(a, b, layout="rcr", config=GemmConfig(16, 64, 32, 2, 4, 2, variant, 1, 2), c=c)
    assert _rel(c, _reference(a, b, "rcr")) < 2e-3
    rest = buf.clone()
    rest[1:M + 1, 8:N + 8] = 7.0
    assert torch.all(rest == 7.0)


@pytest.mark.parametrize("variant", ["tma_cs", "tma_persistent_cs"])
def test_c_desc_store_epilogue_batched(variant, monkeypatch):
    # D tensors (loaded through pointers, per slice) and an activation before the descriptor store
    g = torch.Generator().manual_seed(13)
    B, M, N, K = 3, 45, 72, 40
    a = _stored((M, K), True, torch.float16, batch=B, gen=g)
    b = _stored((K, N), False, torch.float16, batch=B, gen=g)
    d0 = torch.randn(B, M, N, generator=g).to(torch.float16).to(DEV)
    d1 = torch.randn(N, generator=g).to(torch.float16).to(DEV)
    cfg = GemmConfig(32, 64, 16, 2, 4, 2, variant, 1, 4)
    ran = _ran(monkeypatch)
    for op, act in (("add", "gelu"), ("mul", "relu")):
        c = gemm(a, b, layout="rcr", config=cfg, d_tensors=(d0, d1), d_op=op, activation=act)
        assert c.shape == (B, M, N)
        assert _rel(c, _reference(a, b, "rcr", (d0, d1), op, act)) < 3e-3
    assert ran == [f"{cfg.name}_fp16_rcr"] * 2


@pytest.mark.parametrize("variant", ["tma_cs", "tma_persistent_cs"])
def test_c_desc_store_refuses_what_it_cannot_describe(variant, monkeypatch):
    # the launcher never swaps in another kernel: it names the key and the reason, and runs nothing
    g = torch.Generator().manual_seed(17)
    cfg = GemmConfig(16, 64, 32, 2, 4, 2, variant, 1, 2)
    ran = _ran(monkeypatch)
    M, N, K = 37, 40, 24
    a = _stored((M, K), True, torch.float16, gen=g)
    b = _stored((K, N), True, torch.float16, gen=g)
    a3 = _stored((M, K), True, torch.float16, batch=2, gen=g)
    a_odd = _stored((67, 96), True, torch.float16, gen=g)
    b_odd = _stored((96, 131), False, torch.float16, gen=g)
    cases = [((a_odd, b_odd, "rcr"), "C strides"),            # N=131: C's rows are not 16-byte aligned
             ((a, b, "rrc"), "column-major C"),
             ((a3, b, "rrr"), "broadcast batch")]
    for (x, y, layout), why in cases:
        with pytest.raises(UnsupportedProblem, match=why) as err:
            gemm(x, y, layout=layout, config=cfg, kernel_name="the_key")
        assert "the_key" in str(err.value)
    assert ran == []
    with pytest.raises(InvalidProblem, match="split_k"):   # split-K has no descriptor-store form
        cfg.evolve(split_k=2)


def test_c_desc_config_rules():
    name = "tri_tma_persistent_cs_m128n256k64_g8_w8_s3_sk1_e2"
    cfg = GemmConfig.from_name(name)
    assert (cfg.variant, cfg.epi_subtile, cfg.c_desc, cfg.is_tma, cfg.is_persistent) == \
        ("tma_persistent_cs", 2, True, True, True)
    assert cfg.name == name
    assert GemmConfig.from_name("tri_tma_persistent_m128n256k64_g8_w8_s3_sk1").epi_subtile == 1
    with pytest.raises(InvalidProblem):
        GemmConfig(variant="tma_persistent", epi_subtile=2)       # pointer store: no slices
    with pytest.raises(InvalidProblem):
        GemmConfig(block_n=32, variant="tma_cs", epi_subtile=4)   # 8-column slices
    with pytest.raises(InvalidProblem):
        GemmConfig(variant="tma_cs", epi_subtile=3)
    with pytest.raises(InvalidProblem):
        GemmConfig(variant="tma_cs", split_k=2)
    with pytest.raises(InvalidProblem):
        kernel_for(cfg, num_sms=8, dtype="bf16", layout="rcc")               # column-major C
    spec = kernel_for(cfg, num_sms=8, dtype="bf16", layout="rcr")
    assert spec.signature["c_desc"] == "tensordesc<bf16[128, 128]>"
    assert "c_ptr" not in spec.arg_names and spec.constexprs["EPI_SUBTILE"] == 2
    assert kernel_for(cfg, num_sms=8, dtype="fp8", layout="rcr", batched=True).signature["c_desc"] == \
        "tensordesc<bf16[1, 128, 128]>"
    # the slice, not the tile, is staged: subtiling frees shared memory for a 4th stage
    s4 = cfg.evolve(num_stages=4)
    assert smem_bytes(s4.evolve(epi_subtile=1), "bf16", num_d=0) > 232448 >= smem_bytes(s4, "bf16", num_d=0)
    subs = {c.epi_subtile for c in iter_configs(variants=("tma_persistent_cs", "tma"), block_m=(128,),
                                                block_n=(32,), block_k=(64,), group_m=(8,), num_warps=(4,),
                                                num_stages=(3,), split_k=(1,))
            if c.variant == "tma_persistent_cs"}
    assert subs == {1, 2}


@pytest.mark.parametrize("split_k,variant,layout", [(2, "plain", "rcr"), (3, "plain", "crr"), (4, "tma", "rrr")])
def test_split_k_deterministic(split_k, variant, layout):
    g = torch.Generator().manual_seed(5)
    M, N, K = (29, 40, 104) if variant == "tma" else (29, 45, 101)
    a = _stored((M, K), layout[0] == "r", torch.float16, gen=g)
    b = _stored((K, N), layout[1] == "r", torch.float16, gen=g)
    bias = torch.randn(M, N, generator=g).to(torch.float16).to(DEV)
    cfg = SMALL.evolve(variant=variant, split_k=split_k)
    c1 = gemm(a, b, layout=layout, config=cfg, d_tensors=(bias,), activation="silu")
    c2 = gemm(a, b, layout=layout, config=cfg, d_tensors=(bias,), activation="silu")
    assert torch.equal(c1, c2)
    assert _rel(c1, _reference(a, b, layout, (bias,), "add", "silu")) < 3e-3


# ------------------------------------------------------------------ stream-K
def _streamk_plan(M, N, K, batch, cfg, sms):
    """Independent count of the stream-K partition: whole tiles, tiles shared by several programs."""
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n) * batch
    iters = -(-K // cfg.block_k)
    dp = tiles if tiles % sms == 0 else max(tiles // sms - 1, 0) * sms
    units = (tiles - dp) * iters
    g = min(sms, units, (tiles - dp) * 8)
    starts = [p * units // g for p in range(g + 1)] if g else [0]
    shared = 0
    for t in range(tiles - dp):
        owners = {p for p in range(g) for u in range(t * iters, (t + 1) * iters) if starts[p] <= u < starts[p + 1]}
        shared += len(owners) > 1
    return dp, shared


@pytest.mark.parametrize("variant", ["streamk", "tma_streamk"])
@pytest.mark.parametrize("M,N,K,sms,layout", [
    (37, 45, 29, 4, "rcr"),      # one K step per tile: whole tiles only
    (53, 45, 203, 5, "crr"),     # 4 x 3 tiles of 13 steps on 5 programs: 5 whole, 7 stream-K
    (29, 61, 150, 7, "rrr"),     # fewer tiles than programs: K split across them
    (100, 70, 77, 3, "ccr"),     # 7 x 3 tiles: 5 whole waves data-parallel, the last 2 stream-K
    (16, 16, 16, 11, "rcr"),     # one unit, more programs than units
    (20, 30, 700, 40, "rcr"),    # 2 tiles of 44 steps: 16 programs (8 per tile), not 40
])
def test_streamk_matches_float64(variant, M, N, K, sms, layout):
    if variant == "tma_streamk":   # descriptor strides: multiples of 8 fp16 elements
        M, N, K = (-(-x // 8) * 8 for x in (M, N, K))
    g = torch.Generator().manual_seed(M * 1000 + N * 10 + K)
    a = _stored((M, K), layout[0] == "r", torch.float16, gen=g)
    b = _stored((K, N), layout[1] == "r", torch.float16, gen=g)
    cfg = GemmConfig(16, 16, 16, 2, 4, 2, variant)
    dp, shared = _streamk_plan(M, N, K, 1, cfg, sms)
    c = gemm(a, b, layout=layout, config=cfg, num_sms=sms)
    assert _rel(c, _reference(a, b, layout)) < 2e-3
    # bitwise the same on a second launch (partials summed in program order), counters back at 0
    assert torch.equal(c, gemm(a, b, layout=layout, config=cfg, num_sms=sms))
    _, locks = _launch_mod.streamk_scratch(a.device, 1, 1)
    assert int(locks.abs().sum()) == 0
    if (M, N, K) == (53, 45, 203):
        assert shared > 0 and dp == 5


@pytest.mark.parametrize("variant", ["streamk", "tma_streamk"])
def test_streamk_epilogue_batched(variant):
    g = torch.Generator().manual_seed(17)
    B, M, N, K = 3, 40, 24, 88
    a = _stored((M, K), True, torch.float16, batch=B, gen=g)
    b = _stored((K, N), False, torch.float16, batch=B, gen=g)
    d0 = torch.randn(B, M, N, generator=g).to(torch.float16).to(DEV)
    d1 = torch.randn(N, generator=g).to(torch.float16).to(DEV)
    cfg = GemmConfig(16, 16, 16, 2, 4, 2, variant)
    assert _streamk_plan(M, N, K, B, cfg, 7)[1] > 0
    c = gemm(a, b, layout="rcr", config=cfg, num_sms=7, d_tensors=(d0, d1), d_op="mul", activation="gelu")
    assert _rel(c, _reference(a, b, "rcr", (d0, d1), "mul", "gelu")) < 3e-3


def test_streamk_int8_and_config_rules():
    g = torch.Generator().manual_seed(19)
    M, N, K = 21, 35, 200
    a = torch.randint(-8, 8, (M, K), generator=g, dtype=torch.int8).to(DEV)
    b = torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8).to(DEV)
    c = gemm(a, b, layout="rcr", config=GemmConfig(16, 16, 32, 2, 4, 2, "streamk"), num_sms=6)
    assert c.dtype == torch.int32
    assert torch.equal(c.cpu().long(), a.cpu().long() @ b.cpu().long().T)
    with pytest.raises(InvalidProblem, match="split_k"):
        GemmConfig(64, 64, 64, 8, 4, 3, "tma_streamk", split_k=2)
    with pytest.raises(InvalidProblem, match="num_sms"):
        kernel_for(GemmConfig(64, 64, 64, 8, 4, 3, "streamk"), dtype="fp16")
    spec = kernel_for(GemmConfig(64, 128, 64, 8, 4, 4, "tma_streamk"), dtype="bf16", num_sms=132)
    assert spec.grid(5000, 5000, 1) == (132, 1, 1) and spec.reduce is None
    assert {"ws_ptr", "lock_ptr"} <= set(spec.arg_names)
    assert spec.workspace_bytes(100, 100) == 132 * 2 * 64 * 128 * 4


def test_bf16_and_fp32_and_int8():
    g = torch.Generator().manual_seed(9)
    M, N, K = 20, 24, 40
    # the interpreter computes bf16 dots on raw bits (wrong): bf16 is checked on the GPU only
    for dt, tol in (((torch.bfloat16, 1e-2),) if _GPU else ()) + ((torch.float32, 1e-5),):
        a = _stored((M, K), True, dt, gen=g)
        b = _stored((K, N), False, dt, gen=g)
        c = gemm(a, b, layout="rcr", config=SMALL)
        assert c.dtype == dt
        assert _rel(c, _reference(a, b, "rcr")) < tol
    a = torch.randint(-8, 8, (M, K), generator=g, dtype=torch.int8).to(DEV)
    b = torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8).to(DEV)
    c = gemm(a, b, layout="rcr", config=SMALL.evolve(block_k=32))
    assert c.dtype == torch.int32
    assert torch.equal(c.cpu().long(), a.cpu().long() @ b.cpu().long().T)


def test_bad_inputs():
    a = torch.randn(8, 16).half().to(DEV)
    with pytest.raises(InvalidProblem):
        gemm(a, torch.randn(8, 17).half().to(DEV), layout="rcr", config=SMALL)
    with pytest.raises(InvalidProblem):
        gemm(a, a, layout="rxr", config=SMALL)
    with pytest.raises(InvalidProblem):
        gemm(a, a.float(), layout="rcr", config=SMALL)
    with pytest.raises(InvalidProblem):
        GemmConfig(variant="persistent", split_k=2)


# ------------------------------------------------------------------ plain data
def test_config_space_and_names():
    assert set(CONFIG_SPACE) == {"block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages",
                                 "variant", "split_k", "epi_subtile"}
    cfgs = list(iter_configs(block_m=(64, 128), block_n=(128,), block_k=(64,), group_m=(8,), num_warps=(4,),
                             num_stages=(3, 4), split_k=(1, 2), max_smem=232448, dtype="bf16"))
    assert cfgs and all(smem_bytes(c, "bf16") <= 232448 for c in cfgs)
    assert not any(c.split_k > 1 and c.is_persistent for c in cfgs)
    assert not any(c.epi_subtile > 1 and not c.c_desc for c in cfgs)
    ws = list(iter_configs(variants=("tma_ws",), block_m=(64, 128), block_n=(128,), block_k=(64,), group_m=(8,),
                           num_stages=(3,), split_k=(1,)))
    assert ws and all(c.num_warps == 4 and c.block_m >= 128 for c in ws)
    for c in cfgs:
        assert GemmConfig.from_name(c.name) == c
    assert smem_bytes(GemmConfig(128, 256, 64, 8, 8, 4), "fp16") == 4 * (128 + 256) * 64 * 2
    # the biggest H100 configs fit its 227 KiB
    assert smem_bytes(GemmConfig(128, 256, 64, 8, 8, 4, "tma_ws"), "fp16") <= 232448


def test_pick_config_table():
    from ck_gemm.heuristics import load_table
    rows = load_table("sm90")
    assert rows, "ck_gemm/tuned/sm90.json is missing or empty"
    for (M, N, K) in [(8192, 8192, 8192), (16, 4096, 4096), (128, 14336, 4096), (333, 777, 999)]:
        for dt in ("bf16", "fp16", "fp8"):
            assert isinstance(pick_config(M, N, K, dt, "sm90"), GemmConfig)
    assert isinstance(pick_config(100, 100, 100, "fp16", "gfx942"), GemmConfig)


# ------------------------------------------------------------------ AOT compilation (subprocess: no interpreter)
_AOT_SCRIPT = textwrap.dedent("""
    import json, sys
    from triton.backends.compiler import GPUTarget
    from ck_gemm.backends.triton import GemmConfig, kernel_for, smem_bytes, VARIANTS, TMA_VARIANTS
    targets = json.loads(sys.argv[1]); dtype = sys.argv[2]; out = []
    for v in VARIANTS:
        cfg = GemmConfig(64, 64, 32, 8, 4, 3, v, 2 if v in ("plain", "tma") else 1)
        spec = kernel_for(cfg, num_sms=8, dtype=dtype, layout="rcr", num_d=1, activation="relu")
        for t in targets:
            if v in TMA_VARIANTS and t[0] != "cuda":
                continue
            tgt = GPUTarget(*t)
            for s in ([spec] + ([spec.reduce] if spec.reduce else [])):
                try:
                    k = s.compile(tgt)
                    out.append([v, s.name, t[1], "ok", k.metadata.shared, smem_bytes(cfg, dtype)])
                except Exception as e:
                    out.append([v, s.name, t[1], "fail", str(e)[:200], 0])
    # C descriptor store: slices, batch, D tensors, and the H100 tile (CUDA only)
    cs = [(GemmConfig(64, 64, 32, 8, 4, 3, "tma_persistent_cs", 1, 2), dict(num_d=2, activation="gelu")),
          (GemmConfig(64, 64, 32, 8, 4, 3, "tma_cs", 1, 4), dict(num_d=1, batched=True)),
          (GemmConfig(64, 64, 32, 8, 4, 3, "tma_persistent_cs", 1, 4), dict(batched=True)),
          (GemmConfig(128, 256, 64, 8, 8, 3, "tma_persistent_cs", 1, 1), dict(even_k=True)),
          (GemmConfig(128, 256, 64, 8, 8, 4, "tma_persistent_cs", 1, 2), dict(even_k=True)),
          (GemmConfig(256, 128, 64, 8, 8, 3, "tma_persistent_cs", 1, 2), dict(even_k=True))]
    for cfg, kw in cs:
        spec = kernel_for(cfg, num_sms=8, dtype=dtype, layout="rcr", **kw)
        for t in targets:
            if t[0] != "cuda":
                continue
            try:
                k = spec.compile(GPUTarget(*t))
                ok = "ok" if "cp.async.bulk.tensor" in k.asm["ptx"] and "st.global" not in k.asm["ptx"] \
                    else "no TMA store"
                out.append([cfg.variant, spec.name, t[1], ok, k.metadata.shared, smem_bytes(cfg, dtype)])
            except Exception as e:
                out.append([cfg.variant, spec.name, t[1], "fail", str(e)[:200], 0])
    print("RESULT" + json.dumps(out))
""")


def _aot(targets, dtype="fp16"):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([str(GEMM_ROOT), str(REPO_ROOT), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, json.dumps(targets), dtype], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def _check_aot(rows):
    fails = [r for r in rows if r[3] != "ok"]
    assert not fails, fails
    for v, name, arch, _, shared, est in rows:
        if "reduce" not in name:
            assert shared <= est, (v, arch, shared, est)


def test_aot_compile_cuda_sm90():
    _check_aot(_aot([TARGETS[0]]))


@pytest.mark.slow
def test_aot_compile_all_targets():
    rows = _aot(TARGETS)
    _check_aot(rows)
    assert {r[2] for r in rows} == {t[1] for t in TARGETS}


# ------------------------------------------------------------------ GPU (device machine)
# run there with: PYTHONPATH=plugins/gemm:. python3 -m pytest -m gpu -n 14 plugins/gemm/tests/test_triton_kernels.py
_GPU_CFGS = [GemmConfig(128, 128, 64, 8, 4, 3, v, 1) for v in VARIANTS] + [
    GemmConfig(16, 64, 128, 1, 4, 4, "plain", 3), GemmConfig(64, 128, 64, 8, 4, 3, "tma", 2),
    GemmConfig(128, 256, 64, 8, 8, 3, "tma_persistent_cs", 1, 2),
    GemmConfig(128, 256, 64, 8, 8, 4, "tma_persistent_cs", 1, 2),
    GemmConfig(128, 128, 64, 8, 4, 3, "tma_cs", 1, 4)]


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", _GPU_CFGS, ids=lambda c: c.name)
@pytest.mark.parametrize("layout", ["rcr", "rrr", "crr", "ccr"])
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_gpu_variants(cfg, layout, dt):
    dt = getattr(torch, dt)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for (M, N, K) in ((1000, 1032, 520), (16, 256, 4096)):
        a = torch.randn((M, K) if layout[0] == "r" else (K, M), device="cuda", generator=gen).to(dt)
        b = torch.randn((K, N) if layout[1] == "r" else (N, K), device="cuda", generator=gen).to(dt)
        bias = torch.randn(N, device="cuda", generator=gen).to(dt) if layout[2] == "r" else \
            torch.randn(N, 1, device="cuda", generator=gen).to(dt)
        ref = _reference(a, b, layout, (bias,), "add", "gelu")
        c = torch.full(((M, N) if layout[2] == "r" else (N, M)), float("nan"), device="cuda", dtype=dt)
        gemm(a, b, layout=layout, config=cfg, c=c, d_tensors=(bias,), activation="gelu")
        err = _rel(c, ref)
        assert err < 1e-2, (cfg.name, layout, dt, M, N, K, err)


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_batched_and_fp8(variant):
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(4, 300, 264, device="cuda", generator=gen).half()
    b = torch.randn(4, 264, 200, device="cuda", generator=gen).half()
    c = gemm(a, b, layout="rrr", config=GemmConfig(64, 64, 64, 8, 4, 3, variant, 1))
    assert _rel(c, _reference(a, b, "rrr")) < 1e-2
    if torch.cuda.get_device_capability() >= (8, 9):
        a8 = torch.randn(512, 256, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        b8 = torch.randn(384, 256, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        c = gemm(a8, b8, layout="rcr", config=GemmConfig(128, 128, 64, 8, 4, 3, variant, 1))
        assert c.dtype == torch.bfloat16
        assert _rel(c, _reference(a8.float(), b8.float(), "rcr")) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU")
def test_gpu_tuned_table_configs():
    from ck_gemm.heuristics import load_table
    gen = torch.Generator(device="cuda").manual_seed(2)
    for cfg in sorted({r[5] for r in load_table("sm90")}, key=lambda c: c.name):
        for (M, N, K) in ((16, 4096, 4096), (1000, 1032, 1024)):
            a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
            b = torch.randn(N, K, device="cuda", generator=gen).bfloat16()
            c = gemm(a, b, layout="rcr", config=cfg)
            assert _rel(c, _reference(a, b, "rcr")) < 1e-2, cfg.name
