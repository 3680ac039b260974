"""Differential fuzz of grouped convolution through the Dispatcher (issue 12).

The reference is float64 torch, independent of ck_conv's own: forward is
``torch.nn.functional.conv{1,2,3}d`` on the explicitly (asymmetrically) padded
input; bwd_data and bwd_weight are its autograd gradients.  Tensors are moved
between the problem's layouts (``NHWGC``, ``NGCHW``, ``GNHWC`` families) and
torch's ``NCHW`` by reading the layout letters here.  Cases come from fixed
seeds: 1/2/3D, groups (depthwise included), stride, dilation, asymmetric
padding, all three directions, fp16/bf16/fp32, odd sizes; each case runs one
kernel drawn from all that support it.  Before each launch the allocator is
handed NaN-filled blocks of the output's size, so an element a kernel never
writes is likely to read back as NaN.  Each element is checked against its own error bound
(:func:`tolerance`), tight enough that a TF32 dot fails it; every case prints a line, and the GPU
tests stop drawing cases when their time budget is spent and report every mismatch at the end.

Backends: ``numpy``, and the Triton kernels under Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set by the root conftest); the ``gpu`` variant runs the
Triton kernels on CUDA with larger sizes (``CK_TEST_GPU=1 pytest -m gpu``).
"""
from __future__ import annotations

import math

import attrs

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ck_conv import ConvProblem  # noqa: E402
from ck_core import Dispatcher, Registry  # noqa: E402
from ck_core.fuzzrun import bound_mismatch  # noqa: E402
from ck_core.testing import skip_unless_backend  # noqa: E402

TD = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
EPS = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -24}
IMG = {1: "W", 2: "HW", 3: "DHW"}
FLT = {1: "X", 2: "YX", 3: "ZYX"}
FAMILIES = ("nhwgc", "ngchw", "gnhwc")
DIRECTIONS = ("forward", "bwd_data", "bwd_weight")
OUT = {"forward": "y", "bwd_data": "dx", "bwd_weight": "dw"}

# (backend, device, arch, cases, size scale)
SETUPS = {
    "numpy": ("numpy", "cpu", "gfx942", 45, 1),
    "triton-interp": ("triton", "cpu", "gfx942", 27, 1),
    "triton-cuda": ("triton", "cuda", "sm90", 40, 4),
}


def _setup_or_skip(name):
    skip_unless_backend(*SETUPS[name][:3])
    return SETUPS[name]


# -- layouts -----------------------------------------------------------------------------------

def _layouts(family, nd):
    """(input, weight, output) layout strings, spelled from the family's letter order."""
    img, flt = IMG[nd], FLT[nd]
    return {"nhwgc": ("N" + img + "GC", "GK" + flt + "C", "N" + img + "GK"),
            "ngchw": ("NGC" + img, "GKC" + flt, "NGK" + img),
            "gnhwc": ("GN" + img + "C", "GK" + flt + "C", "GN" + img + "K")}[family]


def _canonical(kind, nd):
    """torch's order of the same letters: N G C|K spatial (image), G K C spatial (weight)."""
    return {"in": "NGC" + IMG[nd], "out": "NGK" + IMG[nd], "wei": "GKC" + FLT[nd]}[kind]


def to_torch(t, layout, kind, nd):
    canon = _canonical(kind, nd)
    t = t.permute([layout.index(ch) for ch in canon])
    return t.reshape((t.shape[0] * t.shape[1],) + tuple(t.shape[2:])) if kind == "wei" else \
        t.reshape((t.shape[0], t.shape[1] * t.shape[2]) + tuple(t.shape[3:]))


def from_torch(t, layout, kind, nd, G):
    canon = _canonical(kind, nd)
    if kind == "wei":
        t = t.reshape((G, t.shape[0] // G) + tuple(t.shape[1:]))
    else:
        t = t.reshape((t.shape[0], G, t.shape[1] // G) + tuple(t.shape[2:]))
    return t.permute([canon.index(ch) for ch in layout])


# -- the reference -------------------------------------------------------------------------------

def _conv(case, x, w):
    """Forward conv of torch-layout float64 tensors, padding applied explicitly (asymmetric)."""
    pads = []
    for lo, hi in reversed(list(zip(case["pad_left"], case["pad_right"]))):
        pads += [lo, hi]
    fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
          3: torch.nn.functional.conv3d}[len(case["input_spatial"])]
    return fn(torch.nn.functional.pad(x, pads), w, stride=case["stride"], dilation=case["dilation"],
              groups=case["G"])


def reference(case, ops):
    """float64 result in torch layout from float64 torch-layout operands."""
    d = case["direction"]
    if d == "forward":
        return _conv(case, ops["x"], ops["w"])
    if d == "bwd_data":
        x = torch.zeros(ops["x_shape"], dtype=torch.float64, requires_grad=True)
        _conv(case, x, ops["w"]).backward(ops["dy"])
        return x.grad
    w = torch.zeros(ops["w_shape"], dtype=torch.float64, requires_grad=True)
    _conv(case, ops["x"], w).backward(ops["dy"])
    return w.grad


# -- cases ----------------------------------------------------------------------------------------

def _out_size(i, f, s, d, lo, hi):
    return (i + lo + hi - d * (f - 1) - 1) // s + 1


def make_cases(seed, n, scale, dtypes, families):
    """``n`` cases over nine (direction, rank) pairs, each with its own dtype and layout family
    (so a handful of registries serve all cases); sizes, groups, strides, pads drawn per case."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < n:
        i = len(cases)
        j = i % 9
        nd = (1, 2, 3)[j // 3]
        kind = ("plain", "grouped", "depthwise")[int(rng.integers(3))]
        G = 1 if kind == "plain" else int(rng.integers(2, 5))
        cpg, kpg = (1, 1) if kind == "depthwise" else (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
        hi_sp = {1: 17, 2: 8, 3: 5}[nd] * scale
        sp = tuple(int(rng.integers(1, hi_sp + 1)) for _ in range(nd))
        flt = tuple(int(rng.integers(1, 4)) for _ in range(nd))
        stride = tuple(int(rng.integers(1, 4)) for _ in range(nd))
        dil = tuple(int(rng.choice([1, 1, 2])) for _ in range(nd))
        pl = tuple(int(rng.integers(0, 3)) for _ in range(nd))
        pr = tuple(int(rng.integers(0, 3)) for _ in range(nd))
        if any(_out_size(*t) < 1 for t in zip(sp, flt, stride, dil, pl, pr)):
            continue
        direction = DIRECTIONS[j % 3]
        cases.append(dict(
            N=int(rng.integers(1, 3 + scale)), G=G, C=G * cpg, K=G * kpg, input_spatial=sp, filter=flt,
            stride=stride, dilation=dil, pad_left=pl, pad_right=pr, direction=direction,
            dtype=dtypes[(j + j // 3) % len(dtypes)], family=families[(2 * j + j // 3) % len(families)],
            split_k=int(rng.choice([0, 1, 2, 4])) if direction == "bwd_weight" else 1,
            seed=int(rng.integers(1 << 30))))
    return cases


def _problem(case):
    lay = _layouts(case["family"], len(case["input_spatial"]))
    fields = {k: case[k] for k in ("N", "G", "C", "K", "input_spatial", "filter", "stride", "dilation",
                                   "pad_left", "pad_right", "direction", "dtype", "split_k")}
    return ConvProblem(**fields, in_layout=lay[0], wei_layout=lay[1], out_layout=lay[2])


_KEYS: dict = {}
_ALL: dict = {}


def _family(arch, backend, case):
    nd = len(case["input_spatial"])
    k = (arch, backend, case["direction"], case["dtype"], nd, case["family"])
    if k not in _ALL:
        _ALL[k] = Registry.from_enumeration("conv", arch, backend, directions=[case["direction"]],
                                            dtypes=[case["dtype"]], ndims=[nd], layouts=[case["family"]])
    return k, _ALL[k]


def _keys(arch, backend, case):
    """A spread of the enumerated keys of the case's direction, dtype, rank and layout family."""
    k, reg = _family(arch, backend, case)
    if k not in _KEYS:
        keys = list(reg)
        special = [key for key in keys if key.algorithm.specialization != "default"]
        _KEYS[k] = keys[:: max(1, len(keys) // 40)] + special[:: max(1, len(special) // 40)]
    return _KEYS[k]


def _dispatcher(case, arch, backend):
    """One kernel drawn (seeded) from the sampled keys that support the case (from all of the
    family's keys when the spread holds none, e.g. for an exact split)."""
    p = _problem(case)
    if backend == "numpy" and p.split_k > 1:  # the reference kernels do not split: any split
        p = attrs.evolve(p, split_k=0)
    reg = Registry(arch, _keys(arch, backend, case), name="fuzz")
    cands = reg.candidates(p, backend) or _family(arch, backend, case)[1].candidates(p, backend)
    if not cands and p.split_k > 1:  # a reduction too short for that exact split: any split
        p = attrs.evolve(p, split_k=0)
        cands = reg.candidates(p, backend) or _family(arch, backend, case)[1].candidates(p, backend)
    assert cands, f"no kernel supports {case}: {reg.why_not(p)[:3]}"
    pick = cands[int(np.random.default_rng(case["seed"]).integers(len(cands)))]
    return Dispatcher(Registry(arch, [pick], name="fuzz-one"), backend=backend), p


def _draw(g, shape, td, scale=1.0):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(td).to(torch.float64)


def _poison_heap(shape, device):
    """Free NaN-filled blocks of the output's size so the next allocation likely reuses one."""
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        torch.full(shape, float("nan"), dtype=dt, device=device)


def run_case(case, arch, backend, device, info=None):
    disp, p = _dispatcher(case, arch, backend)
    if info is not None:
        info["key"] = next(iter(disp.registry)).name
    nd, G, td = p.ndim, p.G, TD[p.dtype]
    lay_in, lay_w, lay_out = p.in_layout, p.wei_layout, p.out_layout
    g = torch.Generator().manual_seed(case["seed"])
    osp = tuple(_out_size(*t) for t in zip(case["input_spatial"], case["filter"], case["stride"],
                                           case["dilation"], case["pad_left"], case["pad_right"]))
    x_shape = (p.N, p.C) + tuple(case["input_spatial"])
    w_shape = (p.K, p.C // G) + tuple(case["filter"])
    y_shape = (p.N, p.K) + osp
    fan = math.sqrt((p.C // G) * math.prod(case["filter"]))
    ops = {"x": _draw(g, x_shape, td), "w": _draw(g, w_shape, td, 1.0 / fan), "dy": _draw(g, y_shape, td),
           "x_shape": x_shape, "w_shape": w_shape}
    named = {}
    for name, kind, lay in (("x", "in", lay_in), ("w", "wei", lay_w), ("dy", "out", lay_out)):
        if name not in p.input_names():
            continue
        t = from_torch(ops[name], lay, kind, nd, G).contiguous()
        named[name] = (t.to(torch.float16 if p.dtype == "fp16" else torch.float32).numpy()
                       if backend == "numpy" else t.to(td).to(device))
    ref = reference(case, ops)
    out_kind, out_lay = {"forward": ("out", lay_out), "bwd_data": ("in", lay_in),
                         "bwd_weight": ("wei", lay_w)}[p.direction]
    if backend == "triton":
        _poison_heap(tuple(from_torch(ref, out_lay, out_kind, nd, G).shape), device)
    out = disp.run(p, **named)
    got = torch.as_tensor(np.asarray(out, dtype=np.float64)) if backend == "numpy" else out.double().cpu()
    got = to_torch(got, out_lay, out_kind, nd)
    return got, ref, disp, ops


#: one fp32 ulp per accumulation step (half for rounding to nearest, half for a truncating
#: tensor-core accumulator) and the standard deviations of accumulated rounding allowed
U_ACC = 2.0 ** -23
LAMBDA = 8.0
#: half the smallest subnormal spacing of each output type
TINY = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134, "fp32": 2.0 ** -150}


def tolerance(case, ops, ref):
    """Per-element error bound of the result (torch layout).

    Each direction's result is a sum of products a*b over a reduction of length ``red``; the
    same reference on squared operands gives sum a**2 b**2 per element.  Accumulated fp32
    rounding: LAMBDA * U_ACC * sqrt(red' * (sum a**2 b**2 + ref**2)) (independent roundings of
    partial sums no larger than that), red' counting one more addition per split; then the
    output rounding u_out |ref|, counted twice (Triton's interpreter truncates to bf16: up to one ulp).
    A TF32 dot would exceed this by ~2**13 / (LAMBDA sqrt(2 red)).
    """
    d, G = case["direction"], case["G"]
    taps = math.prod(case["filter"])
    red = {"forward": case["C"] // G * taps, "bwd_data": case["K"] // G * taps,
           "bwd_weight": ops["dy"].numel() // ops["dy"].shape[1]}[d]
    sq = dict(ops, x=ops["x"] ** 2, w=ops["w"] ** 2, dy=ops["dy"] ** 2)
    q = reference(case, sq)
    splits = max(case["split_k"], 1) if d == "bwd_weight" else 1
    u_out = EPS[case["dtype"]]
    t = LAMBDA * U_ACC * torch.sqrt((red + splits) * (q + ref * ref))
    return t * (1 + 2 * u_out) + 2 * u_out * ref.abs() + TINY[case["dtype"]]


def mismatch(case, got, ref, ops):
    """(None when ``got`` agrees with the float64 reference, else what is wrong; the log figures)."""
    return bound_mismatch(got, ref, tolerance(case, ops, ref))


def _describe(case):
    return ("{direction} {dtype} {family} N={N} G={G} C={C} K={K} in={input_spatial} flt={filter} "
            "stride={stride} dil={dilation} pad={pad_left}/{pad_right} split_k={split_k} seed={seed}").format(**case)


def _fuzz(setup, dtypes, seed, families=FAMILIES, budget=None):
    from ck_core.fuzzrun import budget_s, run_cases

    backend, device, arch, n, scale = _setup_or_skip(setup)

    def one(case, info):
        got, ref, disp, ops = run_case(case, arch, backend, device, info)
        why, info["stats"] = mismatch(case, got, ref, ops)
        return why

    run_cases(f"conv {setup} {'/'.join(dtypes)}", make_cases(seed, n, scale, dtypes, families), one,
              seed=seed, budget=budget_s(budget), describe=_describe)


def test_fuzz_numpy():
    _fuzz("numpy", ("fp16", "bf16", "fp32"), seed=2201)


def test_fuzz_triton_interpreter():
    _fuzz("triton-interp", ("fp16", "fp32", "bf16"), seed=2202)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_fuzz_triton_gpu(dtype):
    # one test per dtype, each with its own time budget: a slow one cannot starve the others
    _fuzz("triton-cuda", (dtype,), seed=2203 + ["fp16", "bf16", "fp32"].index(dtype), budget=90)


def test_layout_round_trip():
    """The reference's own layout moves are inverse to each other (the fuzz leans on them)."""
    g = torch.Generator().manual_seed(5)
    for nd in (1, 2, 3):
        for fam in FAMILIES:
            lays = _layouts(fam, nd)
            for kind, lay, shape in (("in", lays[0], (2, 6) + (3,) * nd), ("wei", lays[1], (6, 2) + (2,) * nd),
                                     ("out", lays[2], (2, 9) + (3,) * nd)):
                t = torch.randn(shape, generator=g, dtype=torch.float64)
                assert torch.equal(to_torch(from_torch(t, lay, kind, nd, 3), lay, kind, nd), t)
