"""One compiled kernel per padded head dim (issue #27): the Triton FMHA kernels take the head dim as a
run-time integer with a constexpr class (``configs.hdim_align``: 0 where it fills its padded blocks, else
8 or 16), and the kernel-cache entries are named by the class (``keys.artifact_name``), so two head dims
of one padded class and alignment (40 and 56; 72 and 88) load one artifact, and their results are right.

The specialisation (the cache entry's material) is compared for sm90 in a subprocess without
TRITON_INTERPRET (the interpreter has no binder); nothing compiles.  The results run in the interpreter
against a float64 reference written from the math."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
pytest.importorskip("ck_fmha")

SCRIPT = textwrap.dedent('''
    import json, sys
    import attrs
    from triton.backends.compiler import GPUTarget
    from ck_core import Registry
    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends.triton_backend import _entry_prefix
    from ck_core.cache import digest
    from ck_fmha.backends.triton import implement as TI
    from ck_fmha.backends.triton.keys import artifact_name

    t = GPUTarget("cuda", 90, 32)
    full = Registry.from_enumeration("fmha", "sm90", "triton")
    out = {}
    for family in sys.argv[1:]:
        def entries(base, d):
            k = attrs.evolve(base, signature=attrs.evolve(base.signature, hdim_q=d, hdim_v=d))
            assert _entry_prefix(k, TI.render(k, "triton")) == artifact_name(k)   # what ck build writes
            return sorted({(artifact_name(k) + sfx, digest(ta.specialise(fn, a, kw, t)[3]))
                           for sfx, fn, a, kw in TI.jit_calls(k)})

        # the first tile (by name) of the family that runs every head dim below (its representatives
        # are problems it supports: shared memory bounds the tile at 128)
        for base in sorted((k for k in full if k.signature.family == family and k.signature.dtype == "fp16"
                            and k.signature.hdim_q == k.signature.hdim_v == 64
                            and "gluon" not in k.algorithm.variant), key=lambda k: k.name):
            got = {str(d): entries(base, d) for d in (40, 48, 56, 64, 72, 88, 128)}
            if all(got.values()):
                out[family] = got
                break
    print("RESULT" + json.dumps(out))
''')


@pytest.mark.parametrize("families", [("fwd", "bwd_dq_dk_dv", "fwd_splitkv", "fwd_appendkv")])
def test_head_dims_of_one_class_load_one_artifact(families):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT, *families], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT")][-1][6:])
    for family in families:
        e = {int(d): {tuple(x) for x in v} for d, v in got[family].items()}
        assert e[40] and e[72], family
        assert e[40] == e[56], family        # padded 64, multiples of 8: one artifact per kernel
        assert e[72] == e[88], family        # padded 128, multiples of 8
        assert not e[40] & e[48], family     # multiples of 16: wider loads, another artifact
        assert not e[40] & e[64], family     # a head dim that fills its blocks is a constant (masks fold)
        assert not e[72] & e[128], family
        # entries named by the class (or shared by every key: "fmha/<kernel>")
        assert all("_d64x64_" in n or n.startswith("fmha/") for n, _ in e[40] | e[48] | e[56]), family
        assert all("_d128x128_" in n or n.startswith("fmha/") for n, _ in e[72] | e[88]), family


def _ref(q, k, v, causal):
    """float64 attention from the math: softmax(q k^T / sqrt(d)) v, causal aligned top-left."""
    s = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(~(q.new_ones(n, m, dtype=bool).tril()), float("-inf"))
    return s.softmax(-1) @ v.double()


@pytest.mark.parametrize("d", [40, 56])
def test_run_time_head_dims_are_right(d, ck_rng, monkeypatch):
    """Forward and backward of two head dims of one compiled class (interpreter), against float64;
    the outputs' padding columns would show any load past the head dim (inputs are poisoned there)."""
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors run triton kernels only in the interpreter")
    import ck_fmha
    from ck_core import api

    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    b, h, s = 1, 2, 21

    def leaf():   # a view of the first d columns of wider rows whose tail is NaN: a load past d poisons
        wide = torch.randn(b, h, s, d + 8, generator=g, dtype=torch.float16)
        wide[..., d:] = float("nan")
        return wide[..., :d].requires_grad_()

    q, k, v = leaf(), leaf(), leaf()
    o = ck_fmha.attention(q, k, v, causal=True)
    do = torch.randn(o.shape, generator=g, dtype=o.dtype)
    o.backward(do)
    api.clear()
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _ref(qd, kd, vd, True)
    ref.backward(do.double())

    def rel(a, r):
        return float((a.detach().double() - r.detach()).norm() / r.detach().norm())

    assert o.shape == (b, h, s, d)
    assert rel(o, ref) < 1e-2
    for x, xd in ((q, qd), (k, kd), (v, vd)):
        assert x.grad.shape == x.shape and rel(x.grad, xd.grad) < 2e-2
