"""Prebuilt kernel sets: ``ck build --preset`` compiles what the shipped selection picks for a
preset's problems, and launches of other problems of those kernels then run without compiling:
from the kernel cache, from a set built elsewhere (``CK_KERNEL_SETS``) or from an installed
``ck-kernels-<arch>`` wheel (entry points).  The builds compile for sm90 on this CPU-only machine,
in subprocesses without TRITON_INTERPRET; launchers run on meta tensors, only the final launch is
left out (as tests/test_fmha_built.py)."""
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from ck_core import presets
from ck_core.errors import ConfigError

TINY = {"description": "one attention forward (tests)",
        "groups": [{"op": "fmha",
                    "registry": {"families": ["fwd"], "dtypes": ["$dtype"], "hdims": [["$hdim_q", "$hdim_v"]]},
                    "problems": [{"family": "fwd", "dtype": "fp16", "hdim_q": 32, "mask": ["none", "top_left"],
                                  "batch": 2, "nhead_q": 16, "seqlen_q": 512, "lse": True}]}]}


def test_shipped_presets_load_and_pick_kernels():
    pytest.importorskip("ck_fmha")
    assert {"default", "fmha-serving", "training"} <= set(presets.names())
    for name in ("fmha-serving", "training"):
        keys, rep = presets.keys(presets.load(name), "sm90")
        assert keys and rep["problems"] > 10 and rep["unsupported"] == 0, (name, rep)
        assert len({k.name for k in keys}) == len(keys)


@pytest.mark.parametrize("text, match", [
    ("{", "not valid JSON"),
    ('{"groups": []}', "non-empty list 'groups'"),
    ('{"groups": [{"op": "fmha", "problems": [{}], "filter": "x"}]}', "unknown field"),
    ('{"groups": [{"op": "fmha", "problems": {}}]}', "'problems' is a non-empty list"),
])
def test_bad_presets_say_what_is_wrong(tmp_path, text, match):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        presets.load(str(p))


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match="known: .*default"):
        presets.load("nosuchpreset")
    with pytest.raises(ConfigError, match="letters, digits"):
        presets.load("../no-such-dir/x")   # not a file: taken as a name, and refused as one


WARM = textwrap.dedent('''
    import json, sys
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from ck_core import presets
    from ck_core.backends import triton_artifacts as ta
    from ck_fmha.backends.triton import implement as TI, keys as T
    from ck_fmha.problem import FmhaProblem

    ta.current_target = lambda: GPUTarget("cuda", 90, 32)   # the GPU this box does not have

    def no_compiler(*a, **k):
        raise AssertionError("compiled although a kernel set holds the kernel")

    triton.compile = no_compiler
    ta.launch = lambda name, fn, grid, args, kwargs, cache_root=None, extra=None: ta.kernel_for_call(
        name, fn, args, kwargs, extra=extra)
    keys, _ = presets.keys(presets.load(sys.argv[1]), "sm90")
    meta = lambda *s: torch.empty(s, dtype=torch.float16, device="meta")
    for key in keys:
        d = key.signature.hdim_q
        for b, h, n, mask in ((1, 3, 100, "none"), (4, 8, 2048, "top_left"), (1, 1, 1, "top_left")):
            p = FmhaProblem(family="fwd", batch=b, nhead_q=h, seqlen_q=n, seqlen_k=n, hdim_q=d, dtype="fp16",
                            mask=mask, lse=True)
            if T.supports(key, p) is None:
                TI.make_launcher(key)(p, dict(q=meta(b, h, n, d), k=meta(b, h, n, d), v=meta(b, h, n, d)))
    print("RESULT" + json.dumps({"keys": [k.name for k in keys], "stats": ta.STATS}))
''')


def _env(tmp_path, **extra):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.pop("CK_KERNEL_SETS", None)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env.update(extra)
    return env


def _result(r):
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT")][-1][6:])


def test_preset_build_then_launches_compile_nothing(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    pytest.importorskip("ck_fmha")
    preset = tmp_path / "tiny.json"
    preset.write_text(json.dumps(TINY))
    out, wheels = tmp_path / "set", tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "ck_core", "build", "--preset", str(preset), "--arch", "sm90",
                        "--out", str(out), "--wheel", str(wheels), "--workers", "1"],
                       env=_env(tmp_path, CK_CACHE_DIR=str(tmp_path / "build-cache")),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "0 failed" in r.stdout, r.stdout
    assert not (tmp_path / "build-cache" / "kernels").exists(), "--out builds into the set, not the cache"

    # a fresh process with an empty cache finds the set through CK_KERNEL_SETS
    warm = _result(subprocess.run([sys.executable, "-c", WARM, str(preset)],
                                  env=_env(tmp_path, CK_CACHE_DIR=str(tmp_path / "empty1"), CK_KERNEL_SETS=str(out)),
                                  capture_output=True, text=True, timeout=600))
    assert warm["keys"] and warm["stats"]["compiled"] == 0 and warm["stats"]["loaded"] >= 1, warm

    # and, without it, through the installed wheel (its dist-info on the path: what pip install gives)
    (whl,) = wheels.glob("ck_kernels_sm90-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        assert any(n.startswith("ck_kernels_sm90/kernels/") and n.endswith(".bin") for n in names)
        assert not any(n.endswith(".lock") for n in names)
        z.extractall(site)
    env = _env(tmp_path, CK_CACHE_DIR=str(tmp_path / "empty2"))
    env["PYTHONPATH"] = str(site) + os.pathsep + env.get("PYTHONPATH", "")
    warm = _result(subprocess.run([sys.executable, "-c", WARM, str(preset)], env=env,
                                  capture_output=True, text=True, timeout=600))
    assert warm["stats"]["compiled"] == 0 and warm["stats"]["loaded"] >= 1, warm
    assert not list((tmp_path / "empty2").rglob("*.bin")), "loaded from the set: nothing written to the cache"


@pytest.mark.parametrize("argv, match", [
    (["build", "--preset", "default", "--arch", "sm90", "--wheel", "w"], "give --out DIR"),
    (["build", "gemm", "--preset", "default", "--arch", "sm90"], "drop the op"),
    (["build", "--arch", "sm90"], "needs an op"),
    (["build", "--preset", "nosuch", "--arch", "sm90"], "no preset 'nosuch'"),
])
def test_build_preset_cli_refuses_what_it_cannot_do(argv, match, capsys):
    from ck_core.cli import main

    assert main(argv) == 2
    assert match in capsys.readouterr().err
