"""GEMM on the numpy backend: problems, reference, dispatch, validation."""
import numpy as np
import pytest

from ck_core import CkError, Dispatcher, InvalidProblem, KernelKey, MissingKernel, Registry
from ck_core.dtypes import quantize
from ck_core.testing import check_against_reference
from ck_core.validate import compare
from ck_gemm import GemmProblem
from ck_gemm.reference import make_inputs, reference, tolerance

DTYPES = ("fp16", "bf16", "fp32", "fp8", "bf8", "int8")
LAYOUTS = ("rcr", "rrr", "crr", "ccr")


def _independent(problem, t):
    """A float64 GEMM written without the plugin's helpers: index the storage directly."""
    bt, m, n, k = problem.batch, problem.m, problem.n, problem.k
    a = np.asarray(t["a"], np.float64).reshape((bt,) + problem.shape_a()[-2:])
    b = np.asarray(t["b"], np.float64).reshape((bt,) + problem.shape_b()[-2:])
    la = a if problem.layout[0] == "r" else np.swapaxes(a, 1, 2)
    lb = b if problem.layout[1] == "r" else np.swapaxes(b, 1, 2)
    c = np.einsum("bmk,bkn->bmn", la, lb)
    if problem.layout[2] == "c":
        c = np.swapaxes(c, 1, 2)
    return c.reshape(problem.shape_c())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_independent_float64(dtype, layout, ck_rng):
    m, n, k = (int(x) for x in ck_rng.integers(1, 40, size=3) * 2 + 1)  # odd sizes
    batch = int(ck_rng.integers(1, 3))
    p = GemmProblem(m=m, n=n, k=k, batch=batch, dtype=dtype, layout=layout)
    t = make_inputs(p, ck_rng)
    ref = reference(p, t)["c"]
    ind = _independent(p, t)
    rel = np.linalg.norm(ref - ind) / np.linalg.norm(ind)
    assert rel < 1e-12


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_backend_kernel_within_dtype_tolerance(dtype, layout, ck_manager, fake_arch, ck_rng):
    m, n, k = (int(x) for x in ck_rng.integers(8, 80, size=3) * 2 + 1)
    p = GemmProblem(m=m, n=n, k=k, dtype=dtype, layout=layout)
    reg = Registry.from_enumeration("gemm", fake_arch.name, dtypes=[dtype], layouts=[layout])
    disp = Dispatcher(reg)
    report = check_against_reference(disp, p, ck_rng)
    assert report.passed, str(report)
    # relative error bound per dtype, against float64
    t = make_inputs(p, ck_rng)
    got = np.asarray(disp.run(p, t["a"], t["b"]), np.float64)
    ref = reference(p, t)["c"]
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    bound = {"fp16": 2e-3, "bf16": 1.5e-2, "fp32": 1e-6, "fp8": 2e-3, "bf8": 2e-3, "int8": 0.0}[dtype]
    assert rel <= bound, (dtype, rel)


def test_validation_can_fail(ck_manager, fake_arch, ck_rng):
    p = GemmProblem(m=33, n=47, k=29, dtype="fp16", layout="rcr")
    t = make_inputs(p, ck_rng)
    ref = reference(p, t)["c"]
    wrong = ref.copy()
    wrong[3, 5] += 1.0
    rtol, atol = tolerance(p)["c"]
    assert not compare(wrong, ref, "fp16", rtol=rtol, atol=atol).passed
    assert not compare(ref.T.copy().reshape(ref.shape) * 0 + np.nan, ref, "fp16").passed


@pytest.mark.parametrize("epi", [dict(num_d=1, d_op="add", activation="relu"),
                                 dict(num_d=2, d_op="mul", activation="gelu"),
                                 dict(num_d=0, activation="silu")])
def test_epilogues(epi, ck_manager, fake_arch, ck_rng):
    p = GemmProblem(m=65, n=63, k=31, dtype="fp32", layout="rrr", batch=2, **epi)
    reg = Registry(fake_arch.name)
    base = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp32"], layouts=["rrr"])
    import attrs
    for key in base:
        reg.add(attrs.evolve(key, signature=attrs.evolve(key.signature, **epi)))
    assert all(KernelKey.from_name(k.name) == k for k in reg)
    report = check_against_reference(Dispatcher(reg), p, ck_rng)
    assert report.passed, str(report)


def test_split_k_kernel(ck_manager, fake_arch, ck_rng):
    import attrs
    base = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], layouts=["rcr"])
    reg = Registry(fake_arch.name, [attrs.evolve(k, algorithm=attrs.evolve(k.algorithm, split_k=3))
                                    for k in base if k.algorithm.pad_k])
    p = GemmProblem(m=17, n=19, k=301, dtype="fp16")
    disp = Dispatcher(reg)
    assert disp.select(p).algorithm.split_k == 3
    assert check_against_reference(disp, p, ck_rng).passed


@pytest.mark.parametrize("kwargs, match", [
    (dict(m=0, n=4, k=4), "positive"),
    (dict(m=-3, n=4, k=4), "positive"),
    (dict(m=4, n=4, k=4, dtype="fp64x"), "unknown dtype"),
    (dict(m=4, n=4, k=4, layout="rxr"), "layout"),
    (dict(m=4, n=4, k=4, activation="swish"), "activation"),
    (dict(m=4, n=4, k=4, dtype="int8", dtype_c="fp16"), "int32"),
    (dict(m=4.5, n=4, k=4), "positive"),
])
def test_malformed_problems(kwargs, match):
    with pytest.raises(CkError, match=match):
        GemmProblem(**kwargs)


def test_mismatched_arrays(ck_manager, fake_arch, ck_rng):
    p = GemmProblem(m=33, n=17, k=9, dtype="fp16", layout="rcr")
    disp = Dispatcher(Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], layouts=["rcr"]))
    a = quantize(ck_rng.uniform(-1, 1, (33, 9)), "fp16")
    b = quantize(ck_rng.uniform(-1, 1, (17, 9)), "fp16")
    with pytest.raises(InvalidProblem, match="'b' has shape"):
        disp.run(p, a, b.T.copy())
    with pytest.raises(InvalidProblem, match="numpy dtype"):
        disp.run(p, a.astype(np.float32), b)
    with pytest.raises(InvalidProblem, match="needs tensor 'b'"):
        disp.run(p, a)


def test_no_kernel_is_a_clear_error(ck_manager, fake_arch):
    reg = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], layouts=["rcr"])
    with pytest.raises(MissingKernel, match="no kernel"):
        Dispatcher(reg).select(GemmProblem(m=4, n=4, k=4, dtype="bf16"))


def test_problem_dict_round_trip():
    p = GemmProblem(m=3, n=5, k=7, batch=2, dtype="bf16", layout="ccr", num_d=1)
    assert GemmProblem.from_dict(p.to_dict()) == p
    with pytest.raises(InvalidProblem, match="no field"):
        GemmProblem.from_dict({"m": 1, "n": 1, "k": 1, "q": 2})
