"""Built is what runs, for conv: ``ck build`` of a conv Triton key compiles the launches of a
representative problem (``ck_conv.backends.triton.keys.jit_calls``), so the launcher loads them for
problems of the same specialisation (channels multiples of 16, spatial sizes that are not).

As tests/test_triton_artifacts.py: compiles for sm90 on this CPU-only machine, in
subprocesses; the launcher runs on meta tensors and only the final launch is left out.
"""
import textwrap

import pytest

from ck_core.testing import run_compiled

pytest.importorskip("triton")
pytest.importorskip("ck_conv")

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from ck_core import Registry
    from ck_core.backends import triton_artifacts as ta
    from ck_core.build import build_registry
    from ck_conv import keys as P
    from ck_conv.keys import ConvKernelConfig
    from ck_conv.backends.triton.launch import run
    from ck_conv.problem import ConvProblem

    mode, cache, out = sys.argv[1], sys.argv[2], {}
    ta.current_target = lambda: GPUTarget("cuda", 90, 32)   # the GPU this box does not have
    key = P.key_of(ConvKernelConfig(direction="forward", dtype="fp16", ndim=2, tile=(64, 64, 32)), "sm90", "triton")
    got = []

    def lookup(name, fn, grid, args, kwargs, cache_root=None, extra=None):
        """triton_artifacts.launch up to the launch itself (no GPU here)."""
        ck, _ = ta.kernel_for_call(name, fn, args, kwargs, cache_root=cache, extra=extra)
        got.append(name)

    def launcher_call(n, hw, c):
        """The kernels the Dispatcher's launcher of ``key`` launches for an NHWGC 3x3 problem."""
        p = ConvProblem(N=n, C=c, K=c, input_spatial=(hw, hw), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1))
        assert P.supports(key, p) is None, P.supports(key, p)
        t = {"x": torch.empty(p.input_shape, dtype=torch.float16, device="meta"),
             "w": torch.empty(p.weight_shape, dtype=torch.float16, device="meta")}
        run(p, t, P.config_of(key), num_sms=132, kernel_name=key.name, compile_options=ta.compile_options(key))

    def no_compiler(*a, **k):
        raise AssertionError("compiled although the cache holds the kernel")

    ta.launch = lookup
    if mode == "build":
        rep = build_registry(Registry("sm90", [key]), max_workers=1, progress=False, cache_root=cache)
        out["failed"] = {str(k): str(v)[:2000] for k, v in rep.failed.items()}
    elif mode == "warm":
        triton.compile = no_compiler
        launcher_call(8, 56, 128)               # another problem than ck build's, same specialisation
        out["stats"] = dict(ta.STATS)
        # batch, spatial sizes and channel counts are run-time (channels: their 16-alignment class),
        # so odd spatial sizes, a unit batch and channels that are not whole K tiles load too
        launcher_call(1, 1, 16)
        launcher_call(3, 17, 48)
        launcher_call(2, 100, 80)
        out["more"] = dict(ta.STATS)
    elif mode == "cold":
        launcher_call(1, 9, 24)                 # channels not multiples of 16: another kernel
        out["stats"] = dict(ta.STATS)
    out["key"] = key.name
    out["launched"] = got
    print("RESULT" + json.dumps(out))
''')


def _run(mode, cache):
    return run_compiled(["-c", SCRIPT, mode, str(cache / "kernels")], env={"TRITON_CACHE_DIR": str(cache / "triton")},
                        timeout=900)


def test_conv_launcher_loads_what_ck_build_compiled(tmp_path):
    assert _run("build", tmp_path)["failed"] == {}
    warm = _run("warm", tmp_path)   # a fresh process; triton.compile raises in it
    names = warm["launched"]
    assert warm["stats"] == {"compiled": 0, "loaded": 1, "memory": 0}, warm
    assert names and all(n.startswith(warm["key"] + "/conv_") for n in names), names
    assert warm["more"]["compiled"] == 0, warm["more"]
    assert warm["more"]["loaded"] <= 2, warm["more"]   # whole K tiles or not (EVEN_C)
    cold = _run("cold", tmp_path)["stats"]
    assert cold["compiled"] >= 1, "an unaligned problem must not run the aligned kernel"


@pytest.mark.parametrize("direction", ["forward", "bwd_data", "bwd_weight"])
def test_conv_keys_trace_their_launches(direction):
    """A sample of sm90 conv keys: where the rendering offers ``jit_calls`` (a representative problem
    the key runs as named), tracing it yields the key's conv kernels, under no other names."""
    pytest.importorskip("torch")
    from ck_conv import plugin as P

    from ck_core.plugins import get_manager

    keys = P.enumerate_keys(get_manager().arch("sm90"), "triton", {"ndims": [2], "directions": [direction],
                                                                    "dtypes": ["fp16"]})
    traced = 0
    for key in keys[::max(1, len(keys) // 60)]:
        r = P.render(key, "triton")
        if r.jit_calls is None:
            continue
        calls = r.jit_calls()
        names = {c[0] for c in calls}
        assert calls and all(n.startswith(("/conv_", "/dw_", "/splitk_reduce", "/kernel")) for n in names), names
        traced += 1
    assert traced >= 30, traced
