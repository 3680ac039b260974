"""Vector facts of the pointer GEMM kernels (``A_VEC`` / ``B_VEC``, ``launch.vec_elems``).

A masked load along an operand's contiguous axis is a vector only where the compiler knows the
mask bound (M of a column-major A, N of a row-major B, K of the others) and the row stride are
multiples of the vector; Triton specialises multiples of 16 only, so M = 404 (ccr / crr, issue
#29) was read one element a load.  The launcher now tells the kernel the largest power of two
it checked; these tests check that fact on odd strides, views and batches (a wrong fact would
change the strides the kernel computes with: the float64 comparison fails), and, compiled for
sm90 in a subprocess, that the loads become cp.async vectors.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from ck_gemm.backends.triton import GemmConfig, gemm  # noqa: E402
from ck_gemm.backends.triton.launch import vec_elems  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = GemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2)


def test_vec_elems_facts():
    h = torch.float16
    # a column-major A stored (K, M): its rows are M long
    assert vec_elems(torch.empty(64, 404, dtype=h), 404) == 4
    assert vec_elems(torch.empty(64, 22, dtype=h), 22) == 2
    assert vec_elems(torch.empty(64, 408, dtype=h), 408) == 8
    assert vec_elems(torch.empty(64, 405, dtype=h), 405) == 0        # odd: nothing to say
    assert vec_elems(torch.empty(64, 4096, dtype=h), 4096) == 0      # Triton's own multiple of 16
    assert vec_elems(torch.empty(64, 4096, dtype=h), 4092) == 4      # the mask bound decides too
    assert vec_elems(torch.empty(8, 64, 24, dtype=h), 24) == 8       # batch stride 1536
    assert vec_elems(torch.empty(8, 64, 24, dtype=h)[:, :, :20], 20) == 4
    assert vec_elems(torch.empty(64, 24, dtype=torch.float32), 24) == 4   # 16 bytes of fp32
    assert vec_elems(torch.empty(64, 40, dtype=torch.float8_e4m3fn), 40) == 8     # 8 of 16 bytes
    base = torch.empty(64 * 24 + 2, dtype=h)
    assert vec_elems(base[2:].view(64, 24), 24) == 2                 # a base 4 bytes past alignment
    assert vec_elems(base[1:1 + 64 * 24].view(64, 24), 24) == 0


def _stored(rows, cols, row_major, gen, batch=None, pad=0):
    shape = (rows, cols + pad) if row_major else (cols, rows + pad)
    t = torch.randn(((batch,) if batch else ()) + shape, generator=gen).to(torch.float16)
    if pad:
        t = t[..., :shape[-1] - pad]
    return t.to(DEV)


def _logical(t, row_major):
    t = t.double().cpu()
    return t if row_major else t.transpose(-1, -2)


@pytest.mark.parametrize("layout,variant,split_k,batch,pad", [
    ("ccr", "plain", 1, None, 0), ("ccr", "persistent", 1, 3, 0), ("crr", "plain", 2, None, 2),
    ("rrr", "persistent", 1, None, 2), ("rcr", "plain", 1, 2, 0)])
def test_hinted_kernels_match_float64(layout, variant, split_k, batch, pad):
    """Sizes that are multiples of 2 or 4 but not 16 (the hinted kernels), row-stride padded views
    and batches, against float64; C poisoned first."""
    g = torch.Generator().manual_seed(hash((layout, variant, split_k, batch, pad)) % 2**31)
    M, N, K = 20, 36, 44
    a = _stored(M, K, layout[0] == "r", g, batch, pad)
    b = _stored(K, N, layout[1] == "r", g, batch, pad)
    c = torch.full(((batch,) if batch else ()) + ((M, N) if layout[2] == "r" else (N, M)), float("nan"),
                   dtype=torch.float16, device=DEV)
    seen = []

    def capture(spec, vals, M_, N_, b_, name, _seen=seen):
        _seen.append(dict(spec.constexprs))
        from ck_gemm.backends.triton.launch import _launch
        _launch(spec, vals, M_, N_, b_, name)

    cfg = SMALL.evolve(variant=variant, split_k=split_k)
    gemm(a, b, layout=layout, config=cfg, c=c, launch=capture)
    want_a = vec_elems(a, K if layout[0] == "r" else M)
    want_b = vec_elems(b, N if layout[1] == "r" else K)
    assert (seen[0]["A_VEC"], seen[0]["B_VEC"]) == (want_a, want_b)
    assert max(want_a, want_b) > 1, "the case must exercise a hint"
    ref = _logical(a, layout[0] == "r") @ _logical(b, layout[1] == "r")
    ref = ref if layout[2] == "r" else ref.transpose(-1, -2)
    out = c.double().cpu()
    assert torch.isfinite(out).all()
    assert ((out - ref).norm() / ref.norm()).item() < 2e-3


_PTX = textwrap.dedent("""
    import json, re, sys
    from collections import Counter
    from triton.backends.compiler import GPUTarget
    from ck_gemm.backends.triton.aot import kernel_for
    from ck_gemm.backends.triton.configs import GemmConfig
    out = {}
    for vec in ((0, 0), (4, 0)):
        spec = kernel_for(GemmConfig(128, 128, 64, 8, 8, 3, "plain", 1), dtype="fp16", layout="ccr",
                          even_k=True, vec=vec)
        ptx = spec.compile(GPUTarget("cuda", 90, 32)).asm["ptx"]
        out[str(vec[0])] = {"cp_async": Counter(re.findall(r"cp\\.async\\.c[ag]\\.shared\\.global[^,]*,[^,]*, (\\w+)", ptx)),
                            "scalar_loads": len(re.findall(r"ld\\.global(?:\\.\\w+)*\\.b16 ", ptx))}
    print("RESULT" + json.dumps(out))
""")


def test_sm90_ptx_of_a_hinted_column_major_a():
    """ccr, plain 128x128x64 for sm90: without the fact A is read one fp16 a load (the AOT
    signature does not say M is a multiple of anything); with A_VEC = 4, by 8-byte cp.async."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", _PTX], env=env, capture_output=True, text=True, timeout=300)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT")]
    if not line and "ptxas" in p.stderr.lower() + p.stdout.lower():
        pytest.skip("no CUDA toolchain for sm90 in this triton")
    assert line, p.stderr[-2000:]
    res = json.loads(line[0][6:])
    assert res["0"]["scalar_loads"] > 0 and "0x8" not in res["0"]["cp_async"]
    assert res["4"]["scalar_loads"] == 0 and res["4"]["cp_async"].get("0x8", 0) > 0
