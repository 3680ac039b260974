"""benchmarks/models.py runs (CPU smoke, Triton's interpreter): tiny models through the same rows,
one JSON of the ck.models schema, a markdown table, and a failing row that does not stop the others."""
import importlib.util
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="a CPU smoke run (TRITON_INTERPRET=1)")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ck_models_bench", ROOT / "benchmarks" / "models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(bench, tmp_path, capsys, rows, *extra):
    out = tmp_path / "models.json"
    assert bench.main(["--tiny", "--device", "cpu", "--rows", rows, "--rep-s", "0.01", "--out", str(out), *extra]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_cnn_and_llama_rows_run_and_agree(bench, tmp_path, capsys):
    res, table = _run(bench, tmp_path, capsys, "resnet50:train,llama:forward:attn+gemm")
    assert res["name"] == "ck.models" and res["version"] == 1
    assert {"device", "date", "command", "commit", "versions", "rows"} <= set(res)
    rows = res["rows"]
    assert [(r["model"].split()[0], r["mode"], r["ours"]) for r in rows] == [
        ("resnet50", "train", "ck_conv.patch"), ("llama", "forward", "ck_fmha + ck_gemm.patch")]
    for r in rows:
        assert r["status"] == "ok", r.get("traceback", r["status"])
        assert r["ours_ms"] > 0 and r["peer_ms"] > 0 and r["ratio"] == pytest.approx(r["peer_ms"] / r["ours_ms"])
        assert r["ours_first_ms"] > 0 and r["peer_first_ms"] > 0
        assert r["check"]["ok"], r["check"]   # ours against the peer on the same weights and inputs
    assert rows[0]["patched_conv2d"] == 3 and rows[1]["patched_linear"] > 0
    assert table.count("\n| ") == len(rows) and "| resnet50" in table


@pytest.mark.slow   # (~20 s of interpreter decoding)
def test_generate_row_checks_teacher_forced_decode_logits(bench, tmp_path, capsys, monkeypatch):
    # the check must see a wrong decode: the second row's ours-side per-step logits are perturbed
    real, calls = bench._decode_logits, []

    def skewed(m, seq, n):
        out = real(m, seq, n)
        calls.append(1)
        return out * 1.5 if len(calls) == 4 else out   # calls: row 1 peer, ours; row 2 peer, ours
    monkeypatch.setattr(bench, "_decode_logits", skewed)
    res, _ = _run(bench, tmp_path, capsys, "llama:generate:attn")   # the attn and the attn+gemm rows
    good, bad = res["rows"]
    assert good["status"] == "ok", good.get("traceback", good["status"])
    assert good["check"]["metric"] == "decode logits" and good["check"]["ok"], good["check"]
    assert 0.0 <= good["tokens_equal"] <= 1.0
    assert bad["status"] == "ok" and not bad["check"]["ok"] and bad["check"]["value"] > 0.3


def test_a_failing_row_does_not_stop_the_others(bench, tmp_path, capsys, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("a kernel that does not run")

    monkeypatch.setattr(bench, "row_cnn", broken)
    res, table = _run(bench, tmp_path, capsys, "resnet50:infer,convnext_t:infer")
    assert [r["status"] for r in res["rows"]] == ["error: RuntimeError: a kernel that does not run"] * 2
    res, _ = _run(bench, tmp_path, capsys, "resnet50:infer", "--budget-s", "-1")
    assert res["rows"][0]["status"].startswith("skipped: time budget")


def test_patch_routes_layers_and_unpatch_restores(bench):
    import ck_conv
    import ck_gemm

    m = bench.tiny_cnn()
    x = torch.randn(2, 3, 11, 13)
    ref = m(x)
    assert ck_conv.patch(m) == 3 and ck_conv.patch(m) == 3 and ck_gemm.patch(m) == 1
    assert all("forward" in vars(mod) for mod in m if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)))
    y = m(x)
    assert float((y - ref).norm() / ref.norm()) < 1e-4
    y.sum().backward()   # the public APIs' autograd
    assert m[0].weight.grad is not None and m[-1].weight.grad is not None
    assert ck_conv.unpatch(m) == 3 and ck_gemm.unpatch(m) == 1
    assert not any("forward" in vars(mod) for mod in m)
    same = torch.nn.Conv2d(3, 4, 3, padding="same", padding_mode="reflect")
    assert ck_conv.patch(torch.nn.Sequential(same)) == 0   # a padding mode the API does not take stays on torch


def test_isolated_rows_run_in_their_own_processes(bench, tmp_path, capsys):
    """--isolate yes (the default on the GPU): each row in a child process, its row read back; a row the
    child cannot produce is an error row, and the rows after it still run."""
    res, _ = _run(bench, tmp_path, capsys, "resnet50:infer", "--isolate", "yes")
    row = res["rows"][0]   # ("llama:generate:attn" also names the attn+gemm row)
    assert row["status"] == "ok", row.get("traceback", row["status"])
    assert row["mode"] == "infer" and row["ours_ms"] > 0 and row["check"]["ok"]
    bad = bench._isolated("resnet50:infer", ["--tiny", "--device", "cpu", "--no-such-flag"], 60.0)
    assert bad["status"].startswith("error: the row's process exited")


def test_markdown_lists_rows_the_budget_skipped():
    """A row skipped for time (no sides measured) is a table line, not a KeyError after the JSON."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "models.py"
    spec = importlib.util.spec_from_file_location("_models_md", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.markdown([{"model": "llama", "mode": "train", "status": "skipped: time budget spent", "wall_s": 0.0}])
    assert "| llama | train | - |" in text and "skipped" in text
