"""Built is what runs, for the decode-side FMHA families, the TMA forward forms and the Gluon
kernels: ``ck build`` of a split-KV, paged, combine, append-KV, batch-prefill, TMA or Gluon key
compiles the launches of its representative problems (``ck_fmha.backends.triton.keys.jit_calls``),
and the Dispatcher's launcher of that key loads them in a fresh process, for another problem of the
same specialisation, without compiling.

As tests/test_fmha_built.py: sm90 compiles on this CPU-only machine (Gluon's included: Triton
compiles them for a target without the GPU), in subprocesses; the launcher runs on meta tensors
and only the final launch is left out.
"""
import textwrap

import pytest

from ck_core.testing import run_compiled

pytest.importorskip("triton")
pytest.importorskip("ck_fmha")

SCRIPT = textwrap.dedent('''
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from ck_core import Registry
    from ck_core.backends import triton_artifacts as ta
    from ck_core.build import build_registry
    from ck_fmha.backends.triton import implement as TI

    mode, family, variant, cache, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], {}
    ta.current_target = lambda: GPUTarget("cuda", 90, 32)   # the GPU this box does not have
    full = Registry.from_enumeration("fmha", "sm90", "triton", families=[family], dtypes=["fp16"])
    key = min((k for k in full if k.algorithm.variant == variant and TI.render(k, "triton").jit_calls),
              key=lambda k: (k.signature.hdim_q, k.algorithm.splits, k.algorithm.block_m * k.algorithm.block_n,
                             k.name))
    got = []

    def lookup(name, fn, grid, args, kwargs, cache_root=None, extra=None):
        """triton_artifacts.launch up to the launch itself (no GPU here)."""
        ck, _ = ta.kernel_for_call(name, fn, args, kwargs, cache_root=cache, extra=extra)
        got.append(name)

    def no_compiler(*a, **k):
        raise AssertionError("compiled although the cache holds the kernel")

    ta.launch = lookup
    if mode == "build":
        rep = build_registry(Registry("sm90", [key]), max_workers=1, progress=False, cache_root=cache)
        out["failed"] = {str(k): str(v)[:2000] for k, v in rep.failed.items()}
        out["entries"] = sorted(rep.built[key.name].get("kernels", {})) if key.name in rep.built else []
    else:   # warm: the launcher on problems of another batch size, as the Dispatcher runs them
        triton.compile = no_compiler
        launch = TI.make_launcher(key)
        for p, tensors in TI._representatives(key, batch=3):
            launch(p, tensors())
        out["stats"] = dict(ta.STATS)
    out["key"] = key.name
    out["prefix"] = TI.artifact_name(key)   # the entries' name: the key's head-dim class, no split count
    out["launched"] = got
    print("RESULT" + json.dumps(out))
''')


def _run(mode, family, variant, cache):
    return run_compiled(["-c", SCRIPT, mode, family, variant, str(cache / "kernels")], env={"TRITON_CACHE_DIR": str(cache / "triton")},
                        timeout=900)


@pytest.mark.parametrize("family, variant, kernels", [
    ("fwd_splitkv", "ptr", {"fmha_fwd_splitkv_kernel"}),
    ("fwd_pagedkv", "ptr", {"fmha_fwd_splitkv_kernel"}),   # one split: one launch writes o and lse
    ("fwd_splitkv_combine", "ptr", {"fmha_fwd_splitkv_combine_kernel"}),
    ("fwd_appendkv", "ptr", {"fmha_fwd_appendkv_kernel"}),
    ("batch_prefill", "ptr", {"fmha_fwd_kernel"}),
    ("fwd", "tma", {"fmha_fwd_kernel"}),
    ("fwd", "gluon_ws_pers", {"fmha_fwd_gluon_ws_sm90"}),
    ("bwd_dq_dk_dv", "gluon_dkdv", None),   # the key's dQ choice: Triton, Gluon or atomics
])
def test_launcher_loads_what_ck_build_compiled(tmp_path, family, variant, kernels):
    built = _run("build", family, variant, tmp_path)
    assert built["failed"] == {}
    key = built["prefix"]   # (entries are named <artifact name>/<kernel>: keys.artifact_name)
    if kernels is None:
        kernels = {n[len(key) + 1:] for n in built["entries"]}
        assert "fmha_bwd_dkdv_gluon_ws_sm90" in kernels, kernels
    assert {n[len(key) + 1:] for n in built["entries"]} == kernels, built["entries"]
    warm = _run("warm", family, variant, tmp_path)   # a fresh process; triton.compile raises in it
    names = warm["launched"]
    assert names and all(n.startswith(key + "/") for n in names), names
    assert {n[len(key) + 1:] for n in names} == kernels
    assert warm["stats"]["compiled"] == 0 and warm["stats"]["loaded"] >= len(set(names)), warm["stats"]
