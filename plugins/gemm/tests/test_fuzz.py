"""Differential fuzz of GEMM through the Dispatcher (issue 12).

The reference is written here, from the math, in float64 torch: logical A (M x K)
and B (K x N) read from their storage by the layout letters, C = A @ B, then the
D tensors (add/mul) and the activation.  It shares no code with ck_gemm's own
reference.  Cases come from fixed seeds: odd sizes, every layout, fp16/bf16/fp32,
multi-D epilogues and activations, batches, split-K, and each case runs one
kernel drawn from all that support it.  Each element is checked against its own error bound
(:func:`tolerance`: fp32 accumulation, epilogue and output rounding), tight enough that a TF32
dot fails it.  Every case prints a line (kernel, problem, error / bound); the GPU tests stop
drawing cases when their time budget is spent and report every mismatch at the end.  The output
buffer is poisoned with NaN where the launcher takes one, so an element a kernel never writes shows.

Backends: ``numpy``, and the Triton kernels under Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set by the root conftest); the ``gpu`` variants run the
Triton kernels on CUDA with larger sizes (``CK_TEST_GPU=1 pytest -m gpu``).
"""
from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_core.fuzzrun import bound_mismatch  # noqa: E402
from ck_core.testing import skip_unless_backend  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

TD = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: unit roundoff of each output type
EPS = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -24}
LAYOUTS = ("rcr", "rrr", "crr", "ccr")
ACTS = ("none", "relu", "gelu", "silu", "sigmoid", "tanh")

# (backend, device, arch, cases, largest size)
SETUPS = {
    "numpy": ("numpy", "cpu", "gfx942", 64, 70),
    "triton-interp": ("triton", "cpu", "gfx942", 40, 70),
    "triton-cuda": ("triton", "cuda", "sm90", 40, 700),
}


def _setup_or_skip(name):
    skip_unless_backend(*SETUPS[name][:3])
    return SETUPS[name]


# -- the reference ---------------------------------------------------------------------------

def _act(x, name):
    F = torch.nn.functional
    return {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "sigmoid": torch.sigmoid, "tanh": torch.tanh}[name](x)


def _logical(t, letter):
    """A storage tensor (batch, rows, cols) as its logical matrix: 'c' storage is the transpose."""
    return t.transpose(-1, -2) if letter == "c" else t


def reference(case, a, b, ds):
    """float64 C in C's storage layout, from float64 copies of the (already rounded) inputs."""
    lay = case["layout"]
    acc = _logical(a, lay[0]) @ _logical(b, lay[1])
    for d in ds:
        d = _logical(d, lay[2])
        acc = acc + d if case["d_op"] == "add" else acc * d
    return _logical(_act(acc, case["activation"]), lay[2])


# -- cases ------------------------------------------------------------------------------------

def _storage_shape(rows, cols, letter, batch):
    return (batch,) + ((rows, cols) if letter == "r" else (cols, rows))


def make_cases(seed, n, big, dtypes, max_d, device):
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        odd = lambda hi: int(rng.integers(0, hi // 2)) * 2 + 1   # noqa: E731 - odd sizes only
        m, nn, k = odd(big), odd(big), odd(big)
        if i % 7 == 0:
            m, nn, k = (1 if j == i % 3 else s for j, s in enumerate((m, nn, k)))
        num_d = int(rng.integers(0, max_d + 1)) if i % 3 else 0
        act = ACTS[int(rng.integers(len(ACTS)))] if i % 2 else "none"
        cases.append(dict(
            m=m, n=nn, k=k, dtype=dtypes[i % len(dtypes)], layout=LAYOUTS[(i // len(dtypes)) % 4],
            batch=int(rng.choice([1, 1, 2, 3])), num_d=num_d, d_op=str(rng.choice(["add", "mul"])),
            activation=act, split_k=int(rng.choice([1, 1, 2, 3])), seed=int(rng.integers(1 << 30)),
            device=device))
    return cases


_BASE: dict = {}


def _keys(arch, backend, dtype, layout, device="cpu"):
    """A spread of the enumerated keys for (dtype, layout): every tile size, padding and pipeline
    (and on CUDA every variant: TMA, persistent, warp-specialised)."""
    k = (arch, backend, dtype, layout, device)
    if k not in _BASE:
        reg = Registry.from_enumeration("gemm", arch, backend, dtypes=[dtype], layouts=[layout])
        # odd sizes need kernels that pad M, N and K
        keys = [key for key in reg if key.algorithm.pad_m and key.algorithm.pad_n and key.algorithm.pad_k
                and (device == "cuda" or key.algorithm.variant == "tile")]
        _BASE[k] = keys[:: max(1, len(keys) // 60)]
    return _BASE[k]


def _registry(case, arch, backend):
    """Every sampled key re-declared with the case's epilogue and split-K, then one kernel drawn
    (seeded) from those that support the case: each case runs a different kernel."""
    epi = dict(num_d=case["num_d"], d_op=case["d_op"], activation=case["activation"])
    keys = [attrs.evolve(k, signature=attrs.evolve(k.signature, **epi),
                         algorithm=attrs.evolve(k.algorithm, split_k=case["split_k"]))
            for k in _keys(arch, backend, case["dtype"], case["layout"], case["device"])]
    reg = Registry(arch, keys, name="fuzz")
    cands = reg.candidates(GemmProblem(**_problem_fields(case)), backend)
    assert cands, f"no sampled kernel supports {case}"
    pick = cands[int(np.random.default_rng(case["seed"]).integers(len(cands)))]
    return Registry(arch, [pick], name="fuzz-one")


def _problem_fields(case):
    return {k: case[k] for k in ("m", "n", "k", "batch", "dtype", "layout", "num_d", "d_op", "activation")}


def _inputs(case):
    """float64 values already rounded to the storage type, plus the tensors the backend takes."""
    g = torch.Generator().manual_seed(case["seed"])
    lay, bt, td = case["layout"], case["batch"], TD[case["dtype"]]

    def draw(rows, cols, letter, scale=1.0):
        x = torch.randn(_storage_shape(rows, cols, letter, bt), generator=g, dtype=torch.float64) * scale
        return x.to(td).to(torch.float64)

    a = draw(case["m"], case["k"], lay[0])
    b = draw(case["k"], case["n"], lay[1])
    # mul epilogues keep |D| near 1 so products stay in range; add epilogues use the spread of C
    ds = [draw(case["m"], case["n"], lay[2], 1.0 if case["d_op"] == "mul" else math.sqrt(case["k"]))
          for _ in range(case["num_d"])]
    return a, b, ds


def _to_backend(x64, case, backend):
    unbatched = x64[0] if case["batch"] == 1 else x64
    if backend == "numpy":  # numpy storage: float16 / float32 (bf16 values held in float32)
        return unbatched.to(torch.float16 if case["dtype"] == "fp16" else torch.float32).numpy()
    return unbatched.to(TD[case["dtype"]]).to(case["device"])


def run_case(case, arch, backend, info=None):
    reg = _registry(case, arch, backend)
    if info is not None:
        info["key"] = next(iter(reg)).name
    disp = Dispatcher(reg, backend=backend)
    p = GemmProblem(**_problem_fields(case))
    a, b, ds = _inputs(case)
    named = {f"d{i}": _to_backend(d, case, backend) for i, d in enumerate(ds)}
    if backend == "triton":  # a poisoned output buffer (used where the launcher takes one)
        shape_c = _storage_shape(case["m"], case["n"], case["layout"][2], case["batch"])
        named["c"] = torch.full(shape_c[1:] if case["batch"] == 1 else shape_c, float("nan"),
                                dtype=TD[case["dtype"]], device=case["device"])
    out = disp.run(p, _to_backend(a, case, backend), _to_backend(b, case, backend), **named)
    got = torch.as_tensor(np.asarray(out, dtype=np.float64)) if backend == "numpy" else out.double().cpu()
    ref = reference(case, a, b, ds)
    got = got.reshape(ref.shape)
    return got, ref, reg, tolerance(case, a, b, ds).reshape(ref.shape)


#: one fp32 ulp per accumulation step: rounding to nearest costs half of it; the other half
#: allows an accumulator that truncates (tensor cores may)
U_ACC = 2.0 ** -23
#: standard deviations of the accumulated rounding a case may reach (rounding errors are
#: independent; the probability of passing 8 sigma at one of ~1e8 elements is negligible)
LAMBDA = 8.0


def tolerance(case, a, b, ds):
    """Per-element error bound of C, in C's storage layout, from the float64 inputs.

    Accumulation: each of the ~k fp32 additions (plus one per split-K partial) rounds the
    running sum s_i by at most U_ACC |s_i|; summed as independent errors that is
    LAMBDA * U_ACC * sqrt(sum_i s_i**2) <= LAMBDA * U_ACC * sqrt(k' * (sum_l a_l**2 b_l**2 + c**2)).
    The epilogue (D add/mul, activation, all in fp32) adds its own roundings and carries the
    bound through (activations are 1.2-Lipschitz at most); C's rounding to the output type
    adds u_out |C| (counted twice: Triton's interpreter truncates to bf16, up to one ulp).
    TF32 (10-bit mantissa) dots would be ~2**13/(LAMBDA sqrt(2k)) times over it.
    """
    lay = case["layout"]
    A, B = _logical(a, lay[0]), _logical(b, lay[1])
    x = A @ B
    k_eff = case["k"] + case["split_k"]
    t = LAMBDA * U_ACC * torch.sqrt(k_eff * ((A * A) @ (B * B) + x * x))
    for d in ds:
        d = _logical(d, lay[2])
        if case["d_op"] == "add":
            x = x + d
        else:
            t = t * d.abs()
            x = x * d
        t = t + U_ACC * x.abs()
    if case["activation"] != "none":
        t = 1.2 * t + 8 * U_ACC * (1 + x.abs())
    u_out = EPS[case["dtype"]]
    y = _act(x, case["activation"])
    return _logical(t * (1 + 2 * u_out) + 2 * u_out * y.abs() + TINY[case["dtype"]], lay[2])


#: half the smallest subnormal spacing of each output type (rounding near 0 is absolute)
TINY = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134, "fp32": 2.0 ** -150}


def mismatch(case, got, ref, tol):
    """(None when ``got`` agrees with the float64 reference, else what is wrong; the log figures)."""
    return bound_mismatch(got, ref, tol)


def _describe(case):
    return ("{dtype} {layout} m={m} n={n} k={k} batch={batch} split_k={split_k} d={num_d}x{d_op} "
            "act={activation} seed={seed}").format(**case)


def _fuzz(setup, dtypes, seed, budget=None):
    from ck_core.fuzzrun import budget_s, run_cases

    backend, device, arch, n, big = _setup_or_skip(setup)
    max_d = 2 if backend == "triton" else 4

    def one(case, info):
        got, ref, reg, tol = run_case(case, arch, backend, info)
        why, info["stats"] = mismatch(case, got, ref, tol)
        return why

    run_cases(f"gemm {setup} {'/'.join(dtypes)}", make_cases(seed, n, big, dtypes, max_d, device), one,
              seed=seed, budget=budget_s(budget), describe=_describe)


def test_fuzz_numpy():
    _fuzz("numpy", ("fp16", "bf16", "fp32"), seed=1201)


def test_fuzz_triton_interpreter():
    # bf16: Triton 3.6's interpreter computes a bf16 tl.dot wrongly (see test_gemm_triton_dispatch);
    # the GPU variant covers it
    _fuzz("triton-interp", ("fp16", "fp32"), seed=1202)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_fuzz_triton_gpu(dtype):
    # one test per dtype, each with its own time budget: a slow one cannot starve the others
    _fuzz("triton-cuda", (dtype,), seed=1203 + ["fp16", "bf16", "fp32"].index(dtype), budget=90)


def test_more_d_tensors_than_triton_fuses_is_a_supports_reason():
    """Four D tensors are legal for the problem; the Triton kernels fuse two: no kernel, no crash."""
    from ck_core.errors import MissingKernel

    backend, device, arch, _, _ = _setup_or_skip("triton-interp")
    case = dict(m=9, n=7, k=5, batch=1, dtype="fp16", layout="rcr", num_d=4, d_op="add",
                activation="none", split_k=1, seed=3, device=device)
    keys = [attrs.evolve(k, signature=attrs.evolve(k.signature, num_d=4))
            for k in _keys(arch, backend, "fp16", "rcr")]
    with pytest.raises(MissingKernel, match="at most 2 D tensors"):
        Dispatcher(Registry(arch, keys), backend=backend).select(GemmProblem(**_problem_fields(case)))


def test_hand_built_persistent_split_k_key_is_a_supports_reason():
    """A key the enumeration never makes (split-K with a persistent loop) is refused by supports(), so the
    Dispatcher never selects it and the launcher never sees it (the GPU fuzz once selected one)."""
    from ck_core.errors import MissingKernel

    backend, device, arch, _, _ = _setup_or_skip("triton-interp")
    case = dict(m=33, n=17, k=40, batch=1, dtype="fp16", layout="rcr", num_d=0, d_op="add",
                activation="none", split_k=1, seed=5, device=device)
    keys = [attrs.evolve(k, algorithm=attrs.evolve(k.algorithm, split_k=2, variant="persistent"))
            for k in _keys(arch, backend, "fp16", "rcr")]
    with pytest.raises(MissingKernel, match="split-K needs a variant"):
        Dispatcher(Registry(arch, keys), backend=backend).select(GemmProblem(**_problem_fields(case)))


def test_fp32_bound_passes_fp32_accumulation_and_fails_tf32():
    """The fp32 error bound is honest both ways: a K-long sequential fp32 accumulation (the worst
    order, one rounding per step) stays inside it, a TF32 dot (operands cut to a 10-bit mantissa)
    does not."""
    case = dict(m=48, n=40, k=699, batch=1, dtype="fp32", layout="rrr", num_d=0, d_op="add",
                activation="none", split_k=1, seed=11, device="cpu")
    a, b, ds = _inputs(case)
    ref = reference(case, a, b, ds)
    tol = tolerance(case, a, b, ds).reshape(ref.shape)
    a32, b32 = a.float(), b.float()
    acc = torch.zeros(ref.shape, dtype=torch.float32)
    for i in range(case["k"]):
        acc = acc + a32[:, :, i:i + 1] * b32[:, i:i + 1, :]
    why, stats = mismatch(case, acc.double(), ref, tol)
    assert why is None, stats

    def tf32(x):
        return (x.float().view(torch.int32) & ~0x1FFF).view(torch.float32).double()

    why, _ = mismatch(case, tf32(a) @ tf32(b), ref, tol)
    assert why is not None and "over the bound" in why
