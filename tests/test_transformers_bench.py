"""benchmarks/transformers_bench.py --tiny runs end to end on the CPU (Triton interpreter) and its JSON
says the two attention implementations agree (slow: ~30 s; transformers is optional)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tiny_run_agrees(tmp_path):
    out = tmp_path / "tf.json"
    env = dict(os.environ, TRITON_INTERPRET="1", CK_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "transformers_bench.py"), "--tiny",
                        "--skip", "model", "--out", str(out)], capture_output=True, text=True, timeout=600, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    d = json.loads(out.read_text())
    assert d["agreement"]["logits_rel_l2"] < 5e-3 and d["agreement"]["loss_rel_diff"] < 1e-3
    assert max(d["agreement"]["grad_rel_l2"].values()) < 1e-2
    # the two models really run different attention code (a shared config once made both ck_fmha)
    assert 0 < d["attention"]["out_rel_l2"] < 5e-3
    assert d["generate"]["same_tokens_fraction"] == 1.0
