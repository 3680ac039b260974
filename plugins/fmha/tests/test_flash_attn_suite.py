"""CPU smoke test of benchmarks/flash_attn_suite.py (shim package + sampler) on a fake snapshot laid out
like FlashAttention's repository; the real suite needs a GPU and a snapshot (see the script)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "benchmarks", "flash_attn_suite.py")

FAKE = {
    "tests/test_flash_attn.py": """
        from flash_attn.flash_attn_interface import _get_block_size_n, USE_TRITON_ROCM
        from flash_attn.bert_padding import PAD


        def helper(i):
            return PAD + i
    """,
    "tests/test_flash_attn_ck.py": """
        import pytest
        import torch
        import flash_attn
        from flash_attn import flash_attn_func, flash_attn_with_kvcache
        from test_flash_attn import helper
        import ck_fmha.flash_attn as ck


        def test_shim_maps_public_names():
            import os
            assert "CK_SUITE_LEAK" not in os.environ
            assert flash_attn.flash_attn_func is ck.flash_attn_func
            assert flash_attn.flash_attn_with_kvcache is ck.flash_attn_with_kvcache
            assert not flash_attn.flash_attn_interface.USE_TRITON_ROCM


        @pytest.mark.parametrize("i", range(40))
        def test_many(i):
            assert helper(i) == 7 + i


        @pytest.mark.parametrize("s", [3, 5])
        def test_tiny_attention(s):
            q = torch.randn(1, s, 1, 16, dtype=torch.float16)
            assert flash_attn_func(q, q, q, causal=True).shape == q.shape


        @pytest.mark.parametrize("i", range(3))
        def test_fails(i):
            if i == 2:
                pytest.skip("skipped by the test itself")
            assert i == 0, "odd one out"
    """,
    "flash_attn/bert_padding.py": "PAD = 7\n",
}


@pytest.fixture
def snapshot(tmp_path):
    # inside a project whose pytest configuration and conftest.py must not reach the suite
    proj = tmp_path / "proj"
    snap = proj / "fa_snapshot"
    for rel, text in FAKE.items():
        p = snap / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    (proj / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--import-mode=importlib -m slow"\n')
    (proj / "conftest.py").write_text("import os\nos.environ['CK_SUITE_LEAK'] = '1'\n")
    return snap


def _run(snapshot, tmp_path, *extra):
    out = tmp_path / "report.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, SCRIPT, "--fa", str(snapshot), "--json", str(out), *extra],
                          capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


def test_suite_runner_on_fake_snapshot(snapshot, tmp_path):
    proc, rep = _run(snapshot, tmp_path, "--fraction", "0.1", "--min-per-test", "2", "--fa-commit", "fake")
    per = rep["per_test"]
    assert per["test_shim_maps_public_names"] == dict(collected=1, selected=1, passed=1, failed=0, skipped=0,
                                                      not_run=0)
    assert per["test_many"]["collected"] == 40 and per["test_many"]["selected"] == 4
    assert per["test_many"]["passed"] == 4
    assert per["test_tiny_attention"]["passed"] == 2
    f = per["test_fails"]
    assert f["collected"] == 3 and f["selected"] == 2 and f["passed"] + f["failed"] + f["skipped"] == 2
    assert len(rep["failures"]) == f["failed"]
    assert all("odd one out" in x["error"] for x in rep["failures"])
    assert rep["flash_attention_snapshot"] == "fake" and rep["totals"]["selected"] == 9
    assert proc.returncode == (1 if f["failed"] else 0)


def test_budget_leaves_tests_not_run(snapshot, tmp_path):
    _, rep = _run(snapshot, tmp_path, "--budget-s", "0", "-k", "many")
    assert rep["per_test"]["test_many"]["not_run"] == rep["per_test"]["test_many"]["selected"] == 4
    assert rep["totals"]["passed"] == 0
    # file::function picks functions without collecting the others
    _, rep = _run(snapshot, tmp_path, "--tests", "tests/test_flash_attn_ck.py::test_fails", "--min-per-test", "3")
    assert list(rep["per_test"]) == ["test_fails"] and rep["per_test"]["test_fails"]["failed"] == 1
    # file::function[id] runs exactly the named parametrizations, whatever the sample would have kept
    _, rep = _run(snapshot, tmp_path, "--tests", "tests/test_flash_attn_ck.py::test_many[37]",
                  "--tests", "tests/test_flash_attn_ck.py::test_fails[1]", "--fraction", "0", "--min-per-test", "1")
    assert list(rep["tests"]) == ["test_many[37]", "test_fails[1]"]
    assert rep["per_test"]["test_many"]["passed"] == 1 and rep["per_test"]["test_fails"]["failed"] == 1


def test_sample_is_deterministic_and_seeded():
    spec = importlib.util.spec_from_file_location("flash_attn_suite", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    class Hook:
        def pytest_deselected(self, items):
            pass

    class Config:
        hook = Hook()

    def pick(seed):
        items = [Item(f"t.py::test_a[{i}]") for i in range(50)] + [Item(f"t.py::test_b[{i}]") for i in range(5)]
        mod.Sampler(0.1, 1, seed, 1e9).pytest_collection_modifyitems(None, Config(), items)
        return [it.nodeid for it in items]

    a = pick(0)
    assert a == pick(0) and a != pick(1)
    assert len(a) == 6 and sum("test_b" in n for n in a) == 1
    assert "test_b" in a[1]          # round-robin: every function early in the order
