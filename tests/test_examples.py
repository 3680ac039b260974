"""Every script under examples/ runs to a PASS line, as a user would start it.

CPU: the numpy backend (small shapes).  GPU (``-m gpu``, CK_TEST_GPU=1): the triton backend, real
sizes; the FMHA ones spend most of their time in the float64 NumPy reference, so run them side by side:
``CK_TEST_GPU=1 python3 -m pytest -m gpu -n 14 tests/test_examples.py`` (pytest-xdist; 16 cores).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*/[0-9][0-9]_*.py"))

#: the CK dispatcher's 32 Python FMHA examples (dispatcher/examples/fmha/python/) of the seed change
SEED_FMHA = (
    "01_basic_fmha", "02_multi_shape", "03_benchmark", "04_validation", "05_numpy_integration",
    "06_json_export", "07_stress_test", "08_heuristics", "09_multi_registry", "10_advanced_benchmark",
    "11_bf16_fmha", "12_masks_fmha", "13_bias_fmha", "14_dropout_fmha", "15_gqa_fmha", "16_splitkv_fmha",
    "17_appendkv_fmha", "18_backward_fmha", "19_padding_fmha", "20_fp8_fmha", "21_logits_soft_cap_fmha",
    "22_sink_tokens_fmha", "23_batch_prefill_fmha", "24_vlayout_col_fmha", "25_permutation_fmha",
    "26_hdim_variety_fmha", "27_backward_dropout_fmha", "28_backward_dbias_fmha", "29_sweep_seqlen",
    "30_sweep_batch", "31_sweep_nhead", "32_sweep_hdim",
)


def _run(script: Path, backend: str, tmp_path, timeout: int, extra=()) -> subprocess.CompletedProcess:
    env = dict(os.environ, CK_CACHE_DIR=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("TRITON_INTERPRET", None)  # the examples pick their backend themselves
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # N example processes share the cores: BLAS threads per process, not per core
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, threads)
    return subprocess.run([sys.executable, str(script), "--backend", backend, "--seed", "7", *extra],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def test_every_seed_example_is_here():
    names = {p.parent.name: 0 for p in SCRIPTS}
    for p in SCRIPTS:
        names[p.parent.name] += 1
    assert names.get("gemm") == 11 and names.get("conv") == 6 and names.get("fmha", 0) >= 32
    readme = (EXAMPLES / "README.md").read_text()
    missing = [p.name for p in SCRIPTS if p.name not in readme]
    assert not missing, f"examples/README.md does not index {missing}"
    # every seed FMHA example is named in the index's "seed example" column of some row
    fmha = readme[readme.index("## FMHA"):]
    rows = [ln for ln in fmha.splitlines() if ln.startswith("| `")]
    unmatched = [s for s in SEED_FMHA if not any(f"`{s}.py`" in ln.split("|")[3] for ln in rows)]
    assert not unmatched, f"no counterpart indexed for seed example(s) {unmatched}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example_runs_on_cpu(script, tmp_path):
    r = _run(script, "numpy", tmp_path, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert r.stdout.rstrip().splitlines()[-1] == "PASS", out[-3000:]
    assert "FAIL" not in r.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example_runs_on_gpu(script, tmp_path):
    r = _run(script, "triton", tmp_path, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert r.stdout.rstrip().splitlines()[-1] == "PASS", out[-3000:]


def _hints(out: str) -> list:
    """The commands of the ``HINT: <why>: python ...`` lines."""
    import re

    return [m.group(1) for m in re.finditer(r"^HINT: [^\n]*?: (python [^\n]*)$", out, flags=re.M)]


@pytest.mark.parametrize("script, backend, extra", [
    ("gemm/01_basic_gemm", "triton", ()),                      # no GPU: the numpy command
    ("gemm/01_basic_gemm", "triton", ("--arch", "gfx90a")),
    ("fmha/11_fp8", "numpy", ("--arch", "gfx1100")),           # no fp8 FMHA in gfx1100's CK space
    ("fmha/08_appendkv_rope", "numpy", ("--arch", "gfx1100")),
])
def test_every_hint_an_example_prints_runs_as_printed(script, backend, extra, tmp_path):
    """A SKIP says why and prints one HINT: a command that runs to PASS as printed (the hint that
    named TRITON_INTERPRET=1 led into a MissingKernel traceback or a run of many minutes)."""
    import shlex

    if backend == "triton" and Path("/dev/nvidia0").exists():
        pytest.skip("a GPU is here: --backend triton runs instead of skipping")
    r = _run(EXAMPLES / f"{script}.py", backend, tmp_path, timeout=180, extra=extra)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "SKIP:" in r.stdout and "Traceback" not in out, out[-3000:]
    assert "TRITON_INTERPRET" not in out
    (hint,) = _hints(r.stdout)
    argv = shlex.split(hint)
    assert argv[0] == "python" and "--backend" in argv
    env = dict(os.environ, CK_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    h = subprocess.run([sys.executable, *argv[1:]], cwd=EXAMPLES.parent, capture_output=True, text=True,
                       timeout=180, env=env)
    assert h.returncode == 0 and h.stdout.rstrip().splitlines()[-1] == "PASS", (hint, (h.stdout + h.stderr)[-3000:])


ARCHS = ("gfx90a", "gfx950", "gfx1100", "gfx1201", "sm90")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example_runs_or_skips_with_a_hint_on_every_arch(script, arch, tmp_path):
    """`--arch` takes any installed arch: the example passes, or says SKIP with a hint (its feature has
    no kernel in that arch's space) -- never a traceback."""
    r = _run(script, "numpy", tmp_path, timeout=300, extra=("--arch", arch))
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out[-3000:]
    last = r.stdout.rstrip().splitlines()[-1]
    assert last == "PASS" or last.startswith("HINT: "), out[-3000:]
