"""Built is what runs, for FMHA: the Dispatcher's launcher of an fmha Triton key loads the
kernels ``ck build`` compiled for it (entries ``<key's artifact name>/<kernel name>``, or
``fmha/<kernel name>`` for the kernels that depend on no key field).

As tests/test_triton_artifacts.py: compiles for sm90 on this CPU-only machine, in
subprocesses; the launcher runs on meta tensors and only the final launch is left out
(``triton_artifacts.launch`` is replaced by the cache lookup it starts with).
"""
import os
import textwrap

import pytest

from ck_core.testing import run_compiled

pytest.importorskip("triton")
pytest.importorskip("ck_fmha")

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from ck_core import Registry
    from ck_core.backends import triton_artifacts as ta
    from ck_core.build import build_registry
    from ck_fmha.backends.triton import implement as TI
    from ck_fmha.problem import FmhaProblem

    mode, family, cache, out = sys.argv[1], sys.argv[2], sys.argv[3], {}
    ta.current_target = lambda: GPUTarget("cuda", 90, 32)   # the GPU this box does not have
    full = Registry.from_enumeration("fmha", "sm90", "triton")
    key = min((k for k in full if k.signature.family == family and k.signature.dtype == "fp16"
               and TI.render(k, "triton").jit_calls),
              key=lambda k: (k.signature.hdim_q, k.algorithm.block_m * k.algorithm.block_n, k.name))
    got = []

    def lookup(name, fn, grid, args, kwargs, cache_root=None, extra=None):
        """triton_artifacts.launch up to the launch itself (no GPU here)."""
        ck, _ = ta.kernel_for_call(name, fn, args, kwargs, cache_root=cache, extra=extra)
        got.append((name, ck.metadata.name))

    def launcher_call(b, h, n, mask, pad=0):
        """The kernels the Dispatcher's launcher of ``key`` launches for a bhsd problem
        (``pad``: rows ``pad`` elements longer than the head dim, views into a wider buffer)."""
        s = key.signature
        meta = lambda *shape, dt=torch.float16: (torch.empty(shape[:-1] + (shape[-1] + pad,), dtype=dt, device="meta")
                                                 [..., :shape[-1]] if dt == torch.float16 and pad
                                                 else torch.empty(shape, dtype=dt, device="meta"))
        t = {"fwd": dict(q=meta(b, h, n, s.hdim_q), k=meta(b, h, n, s.hdim_q), v=meta(b, h, n, s.hdim_v)),
             "bwd_dq_dk_dv": dict(q=meta(b, h, n, s.hdim_q), k=meta(b, h, n, s.hdim_q),
                                  v=meta(b, h, n, s.hdim_v), do=meta(b, h, n, s.hdim_v),
                                  lse=meta(b, h, n, dt=torch.float32), d=meta(b, h, n, dt=torch.float32))}[family]
        p = FmhaProblem(family=family, batch=b, nhead_q=h, seqlen_q=n, seqlen_k=n, hdim_q=s.hdim_q,
                        hdim_v=s.hdim_v, dtype="fp16", mask=mask, lse=family == "fwd")
        TI.make_launcher(key)(p, t)

    def no_compiler(*a, **k):
        raise AssertionError("compiled although the cache holds the kernel")

    ta.launch = lookup
    if mode == "build":
        rep = build_registry(Registry("sm90", [key]), max_workers=1, progress=False, cache_root=cache)
        out["failed"] = {str(k): str(v)[:2000] for k, v in rep.failed.items()}
    elif mode == "warm":
        triton.compile = no_compiler
        launcher_call(3, 32, 768, "none")      # other problems than ck build's: sizes are run-time
        launcher_call(1, 16, 1024, "top_left")
        launcher_call(1, 3, 100, "none")       # odd sizes, a unit batch: the same kernels
        launcher_call(5, 1, 1, "top_left")     # one head, one row
        out["stats"] = dict(ta.STATS)
    elif mode == "cold":
        launcher_call(1, 3, 100, "none", pad=8)   # rows not 16-element aligned: another class
        out["stats"] = dict(ta.STATS)
    out["key"] = key.name
    out["launched"] = got
    print("RESULT" + json.dumps(out))
''')


def _run(mode, family, cache):
    return run_compiled(["-c", SCRIPT, mode, family, str(cache / "kernels")], env={"TRITON_CACHE_DIR": str(cache / "triton")},
                        timeout=900)


@pytest.mark.parametrize("family, kernels", [
    ("fwd", ["fmha_fwd_kernel"]),
    ("bwd_dq_dk_dv", None),   # its dQ pass is the key's choice: one or two kernels
])
def test_fmha_launcher_loads_what_ck_build_compiled(tmp_path, family, kernels):
    assert _run("build", family, tmp_path)["failed"] == {}
    warm = _run("warm", family, tmp_path)   # a fresh process; triton.compile raises in it
    key = warm["key"]
    names = [n for n, _ in warm["launched"]]
    assert names and all(n.startswith((key + "/", "fmha/")) for n in names), names
    if kernels is not None:
        assert sorted({n[len(key) + 1:] for n in names}) == kernels
    # four problems of other sizes (odd, unit batch, one head, one row) load the kernels of the
    # build's representative: one artifact per kernel and mask, whatever the shape
    assert warm["stats"]["compiled"] == 0, warm
    # per kernel: unmasked and causal (the backward: each with whole tiles or ragged lengths)
    assert warm["stats"]["loaded"] <= (2 if family == "fwd" else 4) * len(set(names)), warm
    assert warm["stats"]["loaded"] + warm["stats"]["memory"] == len(names)
    assert family != "fwd" or warm["stats"]["memory"] >= 2
    cold = _run("cold", family, tmp_path)["stats"]   # unaligned rows are not the built kernel
    assert cold["compiled"] >= 1


def test_attention_launches_under_its_key_names(ck_dispatch_log, ck_rng, monkeypatch):
    """Each kernel of the public attention's forward and backward is looked up in the cache
    as ``<key the Dispatcher chose>/<kernel name>``, the entries ``ck build`` writes."""
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors run triton kernels only in the interpreter")
    import ck_fmha

    from ck_core import api
    from ck_core.backends import triton_artifacts as ta

    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    names, real = [], ta.launch

    def spy(name, fn, grid, args, kwargs, **kw):
        names.append(name)
        return real(name, fn, grid, args, kwargs, **kw)

    monkeypatch.setattr(ta, "launch", spy)
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    q, k, v = (torch.randn(1, 2, 19, 32, generator=g, dtype=torch.float16, requires_grad=True) for _ in range(3))
    o = ck_fmha.attention(q, k, v, causal=True)
    o.backward(torch.randn(o.shape, generator=g, dtype=o.dtype))
    runs = ck_dispatch_log.take()
    api.clear()
    keys = [name for r in runs for name in r[2]]
    assert [r[0].family for r in runs] == ["fwd", "bwd_dq_dk_dv"]
    assert names[0] == keys[0] + "/fmha_fwd_kernel"
    assert names[1] == "fmha/fmha_bwd_dot_do_o_kernel"   # no key field changes its code: one shared entry
    assert names[2] == keys[2] + "/fmha_bwd_dq_dk_dv_kernel"
    assert all(any(n.startswith(kn + "/fmha_") for kn in keys) or n.startswith("fmha/fmha_") for n in names), \
        (names, keys)
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.detach().double() for x in (q, k, v)), is_causal=True)
    assert float((o.detach().double() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize("arch", ["sm90", "gfx942"])
def test_every_built_fmha_key_traces_its_launches(arch):
    """``ck build`` traces each key's launcher on meta tensors: every key whose rendering offers
    ``jit_calls`` yields launches of its own family's kernels (none is silently empty), and
    the unmasked and causal problems both appear where the kernel takes a mask."""
    pytest.importorskip("torch")
    from ck_core import Registry
    from ck_fmha.backends.triton import implement as TI

    # (the kernels that depend on no key field are shared entries "fmha/<kernel>": suffix "//fmha/<kernel>")
    kernel = {"fwd": {"/fmha_fwd_kernel", "/fmha_fwd_gluon_ws_sm90"}, "bwd_dot_do_o": {"//fmha/fmha_bwd_dot_do_o_kernel"},
              "bwd_dq_dk_dv": {"/fmha_bwd_dq_dk_dv_kernel", "/fmha_bwd_dq_kernel", "/fmha_bwd_dkdv_gluon_ws_sm90",
                               "/fmha_bwd_dq_gluon_ws_sm90", "//fmha/fmha_bwd_sum_partials_kernel"},
              "bwd_convert_dq": {"//fmha/fmha_bwd_convert_dq_kernel"},
              "fwd_splitkv": {"/fmha_fwd_splitkv_kernel"}, "fwd_splitkv_combine": {"/fmha_fwd_splitkv_combine_kernel"},
              "fwd_pagedkv": {"/fmha_fwd_splitkv_kernel", "/fmha_fwd_splitkv_combine_kernel"},
              "fwd_appendkv": {"/fmha_fwd_appendkv_kernel"}, "batch_prefill": {"/fmha_fwd_kernel"}}
    seen = set()
    for key in Registry.from_enumeration("fmha", arch, "triton"):
        r = TI.render(key, "triton")
        if r.jit_calls is None:
            # the only keys without a representative problem: tma_host takes power-of-two head dims only
            assert key.algorithm.variant == "tma_host" and key.signature.hdim_q == 96, key.name
            continue
        fam = key.signature.family
        calls = r.jit_calls()
        assert calls and {c[0] for c in calls} <= kernel[fam], (key.name, [c[0] for c in calls])
        masks = {c[3].get("MASK_MODE", int(c[3].get("CAUSAL", -1))) for c in calls   # Gluon kernels: CAUSAL
                 if c[0] != "//fmha/fmha_bwd_sum_partials_kernel"}   # (the group split's sums take no mask)
        if fam in ("fwd", "bwd_dq_dk_dv", "batch_prefill"):
            assert masks == {0, 1}, (key.name, masks)
        seen.add((fam, key.signature.dtype))
    assert {f for f, _ in seen} == set(kernel)
