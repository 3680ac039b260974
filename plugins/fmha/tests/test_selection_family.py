"""A new size of a known FMHA signature reuses its selection family's pick (OpSpec.selection_family).

The picks of a Dispatcher that reuses family picks must equal a fresh full selection's over growing-size
loops (decode: the key length grows by one; prefill; backward; split-KV), on the GPU registries (sm90
Triton keys, enumerated on the CPU); full selections are counted.  Then a decode loop through the public
API under the Triton interpreter: each step right against a float64 reference, selections once per
bucket."""
from __future__ import annotations

import os

import pytest

from ck_core.dispatcher import Dispatcher, size_bucket
from ck_core.plugins import get_manager
from ck_core.winners import Winners
from ck_fmha.problem import FmhaProblem

if os.environ.get("TRITON_INTERPRET") == "1":
    try:   # the kernels are decorated for the interpreter before a test below unsets it (registries only)
        import ck_fmha.backends.triton.launch  # noqa: F401
        import ck_fmha.backends.triton.launch_bwd  # noqa: F401
        import ck_fmha.backends.triton.launch_decode  # noqa: F401
    except ImportError:   # (no triton: the interpreter test skips)
        pass

FAMILIES = ("fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq", "fwd_splitkv", "fwd_splitkv_combine")


def _disp(monkeypatch, arch="sm90", hd=128, dtype="fp16", backend="triton"):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)   # the GPU's registry (TMA, Gluon forms too)
    mgr = get_manager()
    if arch not in mgr.archs():
        pytest.skip(f"{arch} arch plugin not installed")
    reg = mgr.hook.ck_api_registry(op="fmha", arch=mgr.arch(arch), backend=backend,
                                   options=dict(families=FAMILIES, dtypes=(dtype,), hdims=((hd, hd),)))
    return Dispatcher(reg, backend=backend, tuning=Winners(), check_backend=False)


def _loop(monkeypatch, make, sizes, **kw):
    fam, fresh = _disp(monkeypatch, **kw), _disp(monkeypatch, **kw)
    op = get_manager().op("fmha")
    n = 0
    for s in sizes:
        for _, sub in op.plan(make(s)):
            got = fam.select(sub)
            fresh.clear_cache()
            assert got == fresh.select(sub), (s, sub)
            n += 1
    assert fam.selections + fam.family_hits == n
    return fam


CAUSAL = dict(mask="bottom_right", window_left=-1, window_right=0)


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_a_decode_loop_selects_once_per_bucket_and_picks_what_a_full_selection_picks(monkeypatch, hd):
    base = dict(nhead_q=16, nhead_k=4, hdim_q=hd, hdim_v=hd, dtype="fp16", layout="bshd", lse=True, **CAUSAL)
    sizes = range(100, 400)
    d = _loop(monkeypatch, lambda s: FmhaProblem(batch=8, seqlen_q=1, seqlen_k=s, **base), sizes, hd=hd)
    assert d.selections <= len({size_bucket(s) for s in sizes}) and d.family_hits >= 0.9 * len(sizes)
    g = _loop(monkeypatch, lambda s: FmhaProblem(mode="group", batch=8, seqlen_q=1, seqlen_k=s, packed_q=8,
                                                 packed_k=8 * s, runtime_seqstarts=True, **base),
              range(100, 260), hd=hd)   # varlen decode: the packed key count grows too
    assert g.family_hits >= 0.8 * 160


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_prefill_backward_and_splitkv_loops_pick_what_a_full_selection_picks(monkeypatch, hd):
    base = dict(nhead_q=16, nhead_k=4, hdim_q=hd, hdim_v=hd, dtype="fp16", layout="bshd")
    _loop(monkeypatch, lambda s: FmhaProblem(batch=2, seqlen_q=s, seqlen_k=s, lse=True, **CAUSAL, **base),
          range(1, 1200, 13), hd=hd)
    _loop(monkeypatch, lambda s: FmhaProblem(batch=3, seqlen_q=s, seqlen_k=s + 5, lse=True, **base),
          range(1, 1200, 19), hd=hd)
    _loop(monkeypatch, lambda s: FmhaProblem(family="bwd_dq_dk_dv", batch=2, seqlen_q=s, seqlen_k=s, **CAUSAL,
                                             **base), range(1, 1200, 37), hd=hd)
    _loop(monkeypatch, lambda s: FmhaProblem(family="fwd_splitkv", num_splits=4, batch=2, seqlen_q=1, seqlen_k=s,
                                             lse=True, **base), range(4, 1200, 23), hd=hd)
    _loop(monkeypatch, lambda s: FmhaProblem(batch=s, seqlen_q=256, seqlen_k=256, lse=True, **base),
          range(1, 200, 7), hd=hd)


def test_ck_rule_keys_have_no_family(monkeypatch):
    """CK-rule keys rank each length's divisibility by the tiles (padding specialisations): selected in full."""
    d = _disp(monkeypatch, arch="gfx942", hd=128, backend="numpy")
    base = dict(nhead_q=4, nhead_k=4, hdim_q=128, hdim_v=128, dtype="fp16", lse=True, **CAUSAL)
    for s in (121, 128):   # one bucket; 128 is a tile multiple: the unpadded key
        d.select(FmhaProblem(batch=2, seqlen_q=1, seqlen_k=s, **base))
    assert (d.selections, d.family_hits) == (2, 0)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernels in the Triton interpreter")
def test_a_decode_loop_through_the_api_is_right_at_every_step(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import ck_fmha.flash_attn as fa
    from ck_core import api as core

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    b, hq, hk, d = 1, 2, 1, 16
    q = torch.randn(b, 1, hq, d, generator=g).half()
    disp = None
    for s in range(65, 75):   # two buckets: 65..72 and 73..80
        k = torch.randn(b, s, hk, d, generator=g).half()
        v = torch.randn(b, s, hk, d, generator=g).half()
        out = fa.flash_attn_func(q, k, v, causal=True)
        kk, vv = (x.double().transpose(1, 2).repeat_interleave(hq // hk, dim=1) for x in (k, v))
        p = torch.softmax(q.double().transpose(1, 2) @ kk.transpose(-1, -2) * d ** -0.5, dim=-1)
        ref = (p @ vv).transpose(1, 2)
        assert ((out.double() - ref).norm() / ref.norm()).item() < 2e-3, s
        if disp is None:
            disp = core.dispatcher_on("fmha", q, families=("fwd", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"),
                                      dtypes=("fp16",), hdims=((d, d),))
            before, hits = disp.selections - 1, disp.family_hits
    assert disp.selections - before <= 2 and disp.family_hits - hits >= 8


class _Rec:
    """A recorded launch that launches nothing (counted when replayed)."""

    def __init__(self, fn, args, kwargs, log):
        names = list(fn.arg_names)
        self.names, self.args = tuple(names), list(args) + [kwargs.get(n) for n in names[len(args):]]
        self.log = log

    def __call__(self, args):
        self.log.append("replay")

    def slot(self, name):
        return self.names.index(name)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the launch stubs read the interpreter's kernels")
def test_a_new_shape_launches_its_kernel_once_and_then_replays(monkeypatch):
    """The first call of a signature records its launch as it runs (it used to run, then launch once more to
    record); the next call of that signature replays it.  Launches stubbed: the sm90 path on CPU tensors."""
    torch = pytest.importorskip("torch")
    import ck_fmha.flash_attn as fa
    from ck_core import api as core
    from ck_core.backends import triton_artifacts as ta
    from ck_core.backends import triton_replay

    monkeypatch.setenv("CK_BACKEND", "triton")
    monkeypatch.setenv("CK_CPU_ARCH", "sm90")
    core.clear()
    log = []
    monkeypatch.setattr(ta, "launch", lambda name, fn, grid, args, kwargs, **kw: log.append("launch"))
    monkeypatch.setattr(triton_replay, "replayable", lambda t: True)
    monkeypatch.setattr(triton_replay, "record", lambda fn, grid, args, kwargs, **kw: (
        log.append("record"), _Rec(fn, args, kwargs, log))[1])
    try:
        q = torch.randn(2, 1, 8, 64).half()
        for s in (100, 101, 102, 200):
            k, v = torch.randn(2, s, 2, 64).half(), torch.randn(2, s, 2, 64).half()
            del log[:]
            fa.flash_attn_func(q, k, v, causal=True)
            assert log == ["record"], (s, log)
            del log[:]
            fa.flash_attn_func(q, k, v, causal=True)
            assert log == ["replay"], (s, log)
        # a padding mask's key bias (the transformers integration's): replayed with the new bias tensor
        import ck_fmha

        q2 = torch.randn(2, 8, 1, 64).half()
        recs = []
        monkeypatch.setattr(_Rec, "__call__", lambda self, args: (log.append("replay"), recs.append(args)))
        for s in (100, 101):
            k, v = torch.randn(2, 2, s, 64).half(), torch.randn(2, 2, s, 64).half()
            biases = [torch.zeros(2, 1, 1, s).half().expand(2, 1, 1, s) for _ in range(2)]
            del log[:]
            ck_fmha.attention(q2, k, v, causal="bottom_right", align="bottom_right", bias=biases[0])
            assert log == ["record"], (s, log)
            del log[:], recs[:]
            ck_fmha.attention(q2, k, v, causal="bottom_right", align="bottom_right", bias=biases[1])
            assert log == ["replay"] and any(a is biases[1] for a in recs[0]), (s, log)
    finally:
        core.clear()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernels in the Triton interpreter")
def test_a_warm_call_with_a_key_bias_reads_the_new_bias():
    torch = pytest.importorskip("torch")
    import ck_fmha

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v = (torch.randn(1, 2, 5, 16, generator=g).half() for _ in range(3))
    for trial in range(2):   # the second call takes the signature's warm closure
        keep = torch.rand(1, 5, generator=g) > 0.4
        keep[0, 0] = True
        bias = torch.zeros(1, 1, 1, 5).half().masked_fill(~keep[:, None, None, :], float("-inf")).expand(1, 1, 5, 5)
        o = ck_fmha.attention(q, k, v, bias=bias)
        s = (q.double() @ k.double().transpose(-1, -2)) * 16 ** -0.5 + bias.double()
        ref = torch.softmax(s, -1) @ v.double()
        assert ((o.double() - ref).norm() / ref.norm()).item() < 2e-3, trial
