"""Every Triton FMHA key the sm90 enumeration yields fits the H100's shared memory, by the estimate
(``ck_fmha.backends.triton.smem``, checked in ``legal()`` and ``supports()``) and by what Triton really
allocates: keys are compiled for sm90 on this CPU (no GPU: ``CompiledKernel.metadata.shared``), in a
subprocess without TRITON_INTERPRET, through their launchers' own specialisation (``keys.jit_calls``,
plus the same problems with an elementwise bias, which adds conversion scratch).  CI compiles a fixed
sample (the biggest key of each kernel kind); ``-m slow`` compiles every key."""
import json
import os
import subprocess
import sys
import textwrap

import attrs
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from ck_core.key import KernelKey  # noqa: E402
from ck_core.plugins import get_manager  # noqa: E402
from ck_fmha.backends.triton import keys as K  # noqa: E402
from ck_fmha.backends.triton import smem  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

SCRIPT = textwrap.dedent('''
    import json, sys
    import attrs, torch, triton
    from triton.backends.compiler import GPUTarget
    from ck_core.backends import triton_artifacts as ta
    from ck_core.key import KernelKey
    from ck_fmha.backends.triton import implement as KI, keys as K, smem

    tgt = GPUTarget("cuda", 90, 32)
    ta.current_target = lambda: tgt
    out, seen = {}, {}

    def calls(key, bias):
        got = []
        launch = KI.make_launcher(key, capture=got)
        for p, tensors in KI._representatives(key):
            t = tensors()
            if bias:
                if p.family not in ("fwd", "bwd_dq_dk_dv") or p.dtype == "fp8":
                    continue
                p = attrs.evolve(p, bias="elementwise")
                if K.supports(key, p) is not None:
                    continue
                q = t["q"]
                t["bias"] = torch.empty(q.shape[0], q.shape[1], p.seqlen_q, p.seqlen_k, dtype=q.dtype, device="meta")
            launch(p, t)
        return got

    for name in json.loads(sys.argv[1]):
        key = KernelKey.from_name(name)
        s = key.signature
        for bias in (False, True):
            most = 0
            for suffix, fn, args, kwargs in calls(key, bias):
                _, src, options, material = ta.specialise(fn, args, kwargs, tgt)
                memo = json.dumps(material, sort_keys=True, default=str)
                if memo not in seen:
                    seen[memo] = triton.compile(src, target=tgt, options=options.__dict__).metadata.shared
                most = max(most, seen[memo])
            est = smem.need(s.family, s.hdim_q, s.hdim_v, key.algorithm, 1 if s.dtype == "fp8" else 2, bias)
            out[name + ("+bias" if bias else "")] = [est, most]
    print("SMEM" + json.dumps(out))
''')


def _compile(names):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(names)], env=env, capture_output=True,
                       text=True, timeout=3000)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads([x for x in r.stdout.splitlines() if x.startswith("SMEM")][-1][4:])


def _sm90():
    return get_manager().archs()["sm90"]


#: head dims of the tables plus ones the public API enumerates per problem (padded tiles, chunks)
HDIMS = list(K.HDIMS) + [(224, 224), (160, 160), (80, 80), (40, 40)]


def _keys(hdims=None):
    arch = _sm90()
    keys = K.enumerate_keys(arch, "triton", {"hdims": hdims or HDIMS})
    return [k for k in keys if k.algorithm.splits in (0, 1)]   # (the split count is not compiled in)


def _kind(k):
    """The CI sample's kernel kinds: the forward and the backward, each Triton or Gluon (the slow test
    covers split-KV, fp8 and the small kernels); None for the others."""
    a, s = k.algorithm, k.signature
    if s.family in ("fwd", "bwd_dq_dk_dv") and s.dtype != "fp8" and not a.gsplit:
        return (s.family, "gluon" in a.variant + a.dq)
    return None


def _need(k, bias=False):
    s = k.signature
    return smem.need(s.family, s.hdim_q, s.hdim_v, k.algorithm, 1 if s.dtype == "fp8" else 2, bias)


def _sample():
    """The key with the largest estimate of each kernel kind (family, fp8, variant, dQ pass)."""
    best = {}
    for k in _keys():
        kind = _kind(k)
        if kind is None or k.signature.dtype == "fp16":   # (fp16 allocates as bf16 does)
            continue
        if kind not in best or (_need(k), k.signature.hdim_q) > (_need(best[kind]), best[kind].signature.hdim_q):
            best[kind] = k
    # and the backward of issue #25 (head dim 256, dQ by atomics: 263168 B with the table's two stages)
    atomic = [k for k in _keys([(256, 256)]) if k.signature.family == "bwd_dq_dk_dv" and k.algorithm.dq == "atomic"
              and k.signature.dtype == "bf16" and not k.algorithm.gsplit]
    return sorted({k.name for k in list(best.values()) + atomic[:1]})


def _check(res, limit):
    for name, (est, actual) in res.items():
        assert actual > 0 or "bias" in name or "appendkv" in name or "combine" in name, (name, actual)
        assert est >= actual, f"{name}: estimate {est} B is below the {actual} B Triton allocates"
        assert actual <= limit, f"{name}: {actual} B of shared memory; sm90 has {limit}"


def test_every_sm90_key_fits_by_the_estimate():
    arch = _sm90()
    keys = _keys()
    assert keys
    for k in keys:
        assert _need(k) <= arch.lds_bytes, k.name
        assert K.legal(k, arch) is None, (k.name, K.legal(k, arch))


def test_every_head_dim_keeps_forward_and_backward_keys():
    """Pruning by shared memory leaves every head dim something to run: tiles too large for the arch
    are replaced by their nearest smaller form (fewer stages, then halved blocks)."""
    got = {(k.signature.family, k.signature.dtype, k.signature.hdim_q, k.signature.hdim_v) for k in _keys()}
    for hq, hv in HDIMS:
        for dt in ("fp16", "bf16"):
            for fam in ("fwd", "bwd_dq_dk_dv", "fwd_splitkv", "batch_prefill"):
                assert (fam, dt, hq, hv) in got, (fam, dt, hq, hv)
    # the d256 backward with dQ by atomics: the table's 2-stage tile needs ~263 KB; one stage fits
    atomic = [k for k in _keys([(256, 256)]) if k.signature.family == "bwd_dq_dk_dv" and k.algorithm.dq == "atomic"]
    assert atomic and all(k.algorithm.num_stages == 1 for k in atomic)


def _key(name):
    return KernelKey.from_name(name)


def test_supports_refuses_a_key_over_the_limit_with_a_clear_reason():
    """A key from a file or a tuning store (not enumerated) that cannot fit is a supports() reason."""
    big = _key("fmha_bwd_dq_dk_dv_bf16_d256x256_m64n64_w4_s2_kvsplit_dqatomic.sm90.triton")
    p = FmhaProblem(family="bwd_dq_dk_dv", batch=1, nhead_q=2, seqlen_q=217, seqlen_k=217, hdim_q=256,
                    dtype="bf16", mask="top_left")
    why = K.supports(big, p)
    assert why and "shared memory" in why and "232448" in why and "dkdv" in why
    assert K.legal(big, _sm90()) == why
    small = attrs.evolve(big, algorithm=attrs.evolve(big.algorithm, num_stages=1))
    assert K.supports(small, p) is None


def test_an_elementwise_bias_counts_its_conversion_scratch():
    """The bias tile is added to the scores in registers (not pipelined: measured on sm90, it adds
    2 to 8 KiB of layout-conversion scratch, counted as one block_m x block_n tile); a key that fits only without it is refused with a
    reason that names the bias; the tuned tiles still serve biased problems (hdim 96's backward:
    64x64 s2 with the 128x128 dQ pass, and the causal 64x128 s3 with dQ by atomics)."""
    arch = _sm90()
    keys = [k for k in _keys() if k.signature.family in ("fwd", "bwd_dq_dk_dv") and k.signature.dtype != "fp8"
            and "gluon" not in k.algorithm.variant + k.algorithm.dq]   # (the Gluon kernels take no bias)
    assert all(_need(k) <= _need(k, bias=True) <= _need(k) + 2 * 128 * 128 for k in keys)
    k = next(k for k in keys if k.signature.family == "fwd")
    assert K._smem_reason(k, "sm90", _need(k), False) is None
    assert "elementwise bias" in K._smem_reason(k, "sm90", _need(k), True)
    for name, causal in (("fmha_bwd_dq_dk_dv_fp16_d96x96_m64n64_w4_s2_ptr_dqm128n128w8s2.sm90.triton", False),
                         ("fmha_bwd_dq_dk_dv_fp16_d96x96_m64n128_w8_s3_ptr_dqatomic.sm90.triton", True)):
        p = FmhaProblem(family="bwd_dq_dk_dv", batch=2, nhead_q=4, nhead_k=2, seqlen_q=128, seqlen_k=128, hdim_q=96,
                        dtype="fp16", bias="elementwise", mask="top_left" if causal else "none",
                        deterministic=not causal)
        assert K.supports(_key(name), p) is None, name


def test_need_is_at_least_the_tiles():
    """The estimate never drops a tile the kernel holds (a hand-checked case per kernel kind)."""
    a = K.TritonFmhaAlg(128, 64, 8, 2, "ptr")
    assert smem.need("fwd", 256, 256, a) >= 2 * (128 * 256 + 2 * 64 * 512)   # Q + 2 stages of K and V
    b = K.TritonFmhaAlg(64, 64, 4, 2, "kvsplit", dq="atomic")
    # K, V once + 2 stages of Q, dO + the fp32 dQ tile of the atomics: 263168 B measured on sm90
    assert smem.need("bwd_dq_dk_dv", 256, 256, b) >= 2 * (64 * 512 + 2 * 64 * 512) + 4 * 64 * 256
    assert smem.need("fwd", 64, 64, a, bias=True) - smem.need("fwd", 64, 64, a) == 2 * 128 * 64   # one tile


@pytest.mark.slow
def test_issue25_backward_key_compiles_within_the_estimate():
    """The key of issue #25 (head dim 256, dQ by atomics), compiled for sm90 on this CPU (about 80 s of
    CPU: slow; CI checks the estimate against the hand-counted tiles above)."""
    names = [n for n in _sample() if "dqatomic" in n and "d256x256" in n]
    assert len(names) == 1, names
    _check(_compile(names), _sm90().lds_bytes)


@pytest.mark.slow
def test_sampled_keys_compile_within_the_estimate():
    """The biggest key of each kernel kind, compiled for sm90 on this CPU (minutes: slow)."""
    names = _sample()
    assert len(names) == 5 and any("gluon" in n for n in names) and any("dqatomic" in n for n in names)
    _check(_compile(names), _sm90().lds_bytes)


@pytest.mark.slow
def test_every_sm90_key_compiles_within_the_estimate():
    names = sorted({k.name for k in _keys() if k.signature.dtype != "fp16"})
    _check(_compile(names), _sm90().lds_bytes)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [224, 256])
@pytest.mark.parametrize("deterministic", [False, True])
def test_big_head_dim_varlen_causal_backward_runs_on_the_gpu(d, deterministic):
    """Issue #25: FlashAttention's test_flash_attn_varlen_causal[...-217-True-256-...] raised Triton's
    OutOfResources (263168 B > 232448) in the backward; now a key that fits is selected."""
    import torch

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA GPU (CK_TEST_GPU=1)")
    from ck_fmha.flash_attn import flash_attn_varlen_func

    g = torch.Generator(device="cuda").manual_seed(d)
    lens = [217, 128, 5]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    h, total = 4, sum(lens)
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    o = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, deterministic=deterministic)
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    for i, n in enumerate(lens):   # float64 reference per sequence, from the math
        s = slice(int(cu[i]), int(cu[i + 1]))
        qs, ks, vs = (x[s].detach().double().transpose(0, 1).requires_grad_() for x in (q, k, v))
        sc = qs @ ks.transpose(-1, -2) / d ** 0.5
        sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        ref = torch.softmax(sc, -1) @ vs
        gq, gk, gv = torch.autograd.grad(ref, (qs, ks, vs), do[s].double().transpose(0, 1))
        for got, want in ((o[s], ref), (dq[s], gq), (dk[s], gk), (dv[s], gv)):
            want = want.transpose(0, 1)   # [H, n, D] -> [n, H, D]
            err = float((got.double() - want).norm() / want.norm())
            assert err < 2e-2, (d, i, err)
