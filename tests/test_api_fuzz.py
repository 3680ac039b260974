"""Differential fuzz of the public torch APIs against float64 references (tests/api_fuzz.py): on the
CPU in both modes (the numpy backend without the interpreter, in a subprocess; the interpreter, in
this process), small sizes; on the GPU (``-m gpu`` with CK_TEST_GPU=1) over the wide shape space.
Fails on any wrong result or raw (non-CkError) exception; the seed is fresh each run (CK_TEST_SEED
replays one) and the counts are printed."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_fuzz  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU_CASES = 12


def _verdict(s: dict, seed: int) -> None:
    print(json.dumps({k: s[k] for k in ("device", "cases", "seconds", "counts")}), f"fuzz seed {seed}")
    bad = [f for f in s["failures"] if not f["outcome"].startswith("ck_error")]
    assert not bad, (f"fuzz seed {seed} (`python tests/api_fuzz.py --device {s['device']} --cases {s['cases']} "
                     f"--seed {seed}` replays): " + json.dumps(bad, indent=1)[:6000])


def test_fuzz_numpy_backend_without_interpreter(ck_rng, tmp_path):
    seed = int(ck_rng.integers(1 << 30))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CK_BACKEND", "CK_CPU_ARCH")}
    env["CK_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "fuzz.json"
    r = subprocess.run([sys.executable, str(Path(api_fuzz.__file__)), "--cases", str(CPU_CASES), "--seed", str(seed),
                        "--out", str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"rc {r.returncode}: {r.stderr[-3000:]}"
    _verdict(json.loads(out.read_text()), seed)


def test_fuzz_triton_interpreter(ck_rng):
    from ck_core import api

    assert os.environ.get("TRITON_INTERPRET") == "1"
    api.clear()
    seed = int(ck_rng.integers(1 << 30))
    _verdict(api_fuzz.fuzz("cpu", CPU_CASES, seed), seed)


@pytest.mark.gpu
def test_fuzz_gpu(ck_rng, tmp_path):
    torch = pytest.importorskip("torch")
    if os.environ.get("CK_TEST_GPU") != "1" or not torch.cuda.is_available():
        pytest.skip("the GPU fuzz runs with CK_TEST_GPU=1 on a CUDA device")
    seed = int(ck_rng.integers(1 << 30))
    s = api_fuzz.fuzz("cuda", int(os.environ.get("CK_FUZZ_CASES", "300")), seed)
    (tmp_path / "fuzz_gpu.json").write_text(json.dumps(s, indent=1))
    _verdict(s, seed)
