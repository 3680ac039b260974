"""benchmarks/new_shape_latency.py's CPU parts (``growing`` with stubbed launches, ``host`` on meta
tensors) run end to end, each in its own process, into one file of the documented schema (slow: ~15 s
on 2 cores)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_cpu_parts_in_one_file(tmp_path):
    from ck_core.bench import check_result

    out = tmp_path / "new_shape.json"
    env = dict(os.environ, CK_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "new_shape_latency.py"), "--part", "growing",
                        "host", "--device", "cpu", "--steps", "3", "--shapes", "2", "--seed", "5", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    d = json.loads(out.read_text())
    assert check_result(d) == []
    assert d["parts"] == ["growing", "host"] and "first" not in d
    assert "--part growing host" in d["command"]
    g = d["growing"]
    assert g["device"].startswith("cpu") and set(g) >= {"unit", "family_on", "family_off"}
    for label in ("family_on", "family_off"):
        assert len(g[label]) == 4
        for case, row in g[label].items():
            assert "error" not in row, (label, case, row)
            assert row["new_sizes"] == 2 and row["new_us"] > 0 and row["warm_us"] > 0
    assert sum(r["family_hits"] for r in g["family_off"].values()) == 0
    h = d["host"]
    assert h["shapes"] == 10 and len(h["rows"]) == 10 and h["specialisations"] > 0
    for key in ("fwd_ms", "fwd_cpu_ms", "bwd_ms", "bwd_cpu_ms", "warm_fwd_cpu_ms", "warm_bwd_cpu_ms"):
        s = h[key]
        assert 0 < s["median"] <= s["p90"] <= s["max"] and math.isfinite(s["max"]), (key, s)
    for row in h["rows"]:   # batch 1..16, query and key lengths 1..4096 (causal: sq <= sk)
        b, sq, sk = row["shape"]
        assert 1 <= b <= 16 and 1 <= sq <= 4096 and 1 <= sk <= 4096
        assert row["fwd_ms"] > 0 and row["bwd_ms"] > 0
