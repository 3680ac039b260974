"""The public torch APIs on CPU tensors in both CPU modes, forward and backward, against float64
references (tests/api_cases.py): the default numpy backend WITHOUT the interpreter (a subprocess with
TRITON_INTERPRET removed: what a user's CPU machine runs; the root conftest sets it for every other
test), and Triton's interpreter (this process).  Also the README's "Torch users" lines, as written."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_cases  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _plain_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CK_BACKEND", "CK_CPU_ARCH")}
    env["CK_CACHE_DIR"] = str(tmp_path / "cache")
    return env


@pytest.fixture(scope="module")
def numpy_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("numpy_mode")
    r = subprocess.run([sys.executable, str(Path(api_cases.__file__))], env=_plain_env(tmp), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert rows, f"no results (rc {r.returncode}): {r.stderr[-3000:]}"
    return {row["case"]: row for row in rows}


@pytest.mark.parametrize("name", list(api_cases.CASES))
def test_numpy_backend_without_interpreter(numpy_results, name):
    row = numpy_results.get(name)
    assert row is not None, f"{name} did not report (the subprocess died?)"
    if row["status"] == "skip":
        pytest.skip(row["detail"])
    assert row["status"] == "ok", row["detail"]


@pytest.mark.parametrize("name", list(api_cases.CASES))
def test_triton_interpreter(name):
    from ck_core import api

    assert os.environ.get("TRITON_INTERPRET") == "1"
    api.clear()
    row = api_cases.run_case(name)
    if row["status"] == "skip":
        pytest.skip(row["detail"])
    assert row["status"] == "ok", row["detail"]


def test_readme_torch_lines_run_on_a_cpu_machine(tmp_path):
    """The README's torch lines (``attention``, the fp8 forward, ``matmul``, ``conv2d``) as written,
    on CPU tensors, without the interpreter."""
    text = (ROOT / "README.md").read_text()
    start = text.index("Torch users:")
    para = text[start:text.index("On the GPU machine", start)]
    lines = [s for s in re.findall(r"`([^`]+)`", para) if "=" in s and "(" in s and "..." not in s]
    assert any("attention(q, k, v" in s for s in lines) and any("matmul" in s for s in lines) \
        and any("conv2d" in s for s in lines), lines
    setup = """
import torch
q, k, v = (torch.randn(2, 4, 16, 64, dtype=torch.float16) for _ in range(3))
q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
sq = sk = sv = 1.0
a, b, bias = torch.randn(8, 32), torch.randn(32, 16), torch.randn(16)
x, w = torch.randn(2, 8, 9, 9), torch.randn(8, 2, 3, 3)
bias8 = bias
"""
    body = "\n".join(s.replace("; ", "\n") for s in lines)
    code = setup + body.replace("conv2d(x, w, bias,", "conv2d(x, w, torch.randn(8),") + "\nprint('ok')\n"
    r = subprocess.run([sys.executable, "-c", code], env=_plain_env(tmp_path), cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"{body}\n{r.stderr[-3000:]}"
