"""Every script under examples/ runs to a PASS line, as a user would start it.

CPU: the numpy backend (small shapes).  GPU (``-m gpu``, CK_TEST_GPU=1): the triton backend.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*/[0-9][0-9]_*.py"))


def _run(script: Path, backend: str, tmp_path, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, CK_CACHE_DIR=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("TRITON_INTERPRET", None)  # the examples pick their backend themselves
    return subprocess.run([sys.executable, str(script), "--backend", backend, "--seed", "7"],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def test_every_seed_example_is_here():
    names = {p.parent.name: 0 for p in SCRIPTS}
    for p in SCRIPTS:
        names[p.parent.name] += 1
    assert names.get("gemm") == 11 and names.get("conv") == 6 and names.get("fmha", 0) >= 14
    readme = (EXAMPLES / "README.md").read_text()
    missing = [p.name for p in SCRIPTS if p.name not in readme]
    assert not missing, f"examples/README.md does not index {missing}"


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
