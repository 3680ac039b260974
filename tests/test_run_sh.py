"""run.sh: checks the Python version first with a clear message, reuses a good .venv without
installing, and rebuilds a half-installed one (no network here: the paths that would install stop
at a deliberately unsuitable interpreter)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _fake_python(path: Path, version: str, ok: bool) -> Path:
    """An interpreter stand-in: `-V` prints the version, the fit check exits as `ok` says."""
    path.write_text(f"#!/usr/bin/env bash\nif [ \"$1\" = -V ]; then echo 'Python {version}'; exit 0; fi\n"
                    f"exit {0 if ok else 1}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def tree(tmp_path):
    for name in ("run.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for p in [*ROOT.glob("plugins/*/pyproject.toml"), *ROOT.glob("archs/*/pyproject.toml")]:
        dest = tmp_path / p.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, dest)
    return tmp_path


def _run(tree: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(tree / "run.sh")], cwd=tree, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CK_REINSTALL": "0", **env})


def _stamp(tree: Path) -> str:
    return subprocess.run("cat run.sh pyproject.toml plugins/*/pyproject.toml archs/*/pyproject.toml | cksum",
                          shell=True, cwd=tree, capture_output=True, text=True).stdout


def _good_venv(tree: Path) -> None:
    bin_ = tree / ".venv" / "bin"
    bin_.mkdir(parents=True)
    _fake_python(bin_ / "python", "3.12.1", ok=True)
    (bin_ / "ck").write_text("#!/usr/bin/env bash\necho \"fake ck $*\"\n")
    (bin_ / "ck").chmod(0o755)
    (tree / ".venv" / ".ck-installed").write_text(_stamp(tree))


def test_unsuitable_python_is_refused_with_the_versions_that_work(tree):
    py39 = _fake_python(tree / "python3.9", "3.9.18", ok=False)
    r = _run(tree, PYTHON=str(py39))
    assert r.returncode == 4, r.stderr
    assert "3.9.18" in r.stderr and "3.10 to 3.13" in r.stderr and "triton 3.6.0" in r.stderr, r.stderr
    assert not (tree / ".venv").exists()


def test_a_good_venv_runs_the_demo_without_installing(tree):
    _good_venv(tree)
    r = _run(tree, PYTHON=str(_fake_python(tree / "py", "3.9.0", ok=False)))
    assert r.returncode == 0 and r.stdout.strip() == "fake ck demo", r.stdout + r.stderr
    assert "installing" not in r.stderr


@pytest.mark.parametrize("damage", ["no_stamp", "old_stamp", "reinstall", "old_python"])
def test_a_half_installed_or_stale_venv_is_installed_again(tree, damage):
    _good_venv(tree)
    env = {}
    if damage == "no_stamp":
        (tree / ".venv" / ".ck-installed").unlink()
    elif damage == "old_stamp":
        (tree / ".venv" / ".ck-installed").write_text("0 0\n")
    elif damage == "reinstall":
        env["CK_REINSTALL"] = "1"
    else:
        _fake_python(tree / ".venv" / "bin" / "python", "3.9.0", ok=False)
    # the install path starts by choosing an interpreter: an unsuitable one stops it right there
    r = _run(tree, PYTHON=str(_fake_python(tree / "py", "3.9.0", ok=False)), **env)
    assert r.returncode == 4 and "needs Python 3.10 to 3.13" in r.stderr, r.stdout + r.stderr
    assert "fake ck" not in r.stdout
