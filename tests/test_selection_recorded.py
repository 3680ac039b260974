"""The shipped rankers scored on the recorded H100 oracles' held-out shapes (no GPU).

Thresholds sit below what the shipped rankers reach and above what a random pick
reaches on the same shapes (the test checks both), so a ranker that stops
generalising -- or picks at random -- fails here.
"""
import csv
import json
import time
from pathlib import Path

import pytest

from ck_core import ranker, select_data, tuned_data
from ck_core.plugins import get_manager

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "results" / "selection"
#: (geomean, P10) the shipped ranker must reach on held-out shapes; see benchmarks/results/selection/README.md
FLOOR = {"gemm": (0.90, 0.77), "fmha": (0.95, 0.85), "conv": (0.915, 0.825)}
#: most milliseconds ranking one new problem may take here (target: 1 ms; the GEMM ranker's 100
#: trees of depth 8 over 143 candidates take ~0.6 ms on a quiet host, 1.1-2.1 ms on the shared 2-core
#: machine at load 6 (the tree walk is most of it), conv ~0.7 ms and FMHA ~0.07 ms there; see
#: benchmarks/results/selection/README.md and benchmarks/select_time.py for the whole select())
SELECT_MS = {"gemm": 2.5, "fmha": 0.5, "conv": 1.2}   # a guard with headroom for a loaded host


@pytest.fixture(scope="module", params=sorted(FLOOR))
def recorded(request):
    op_name = request.param
    pytest.importorskip(f"ck_{op_name}")
    mgr = get_manager()
    oracle = select_data.load(DATA / f"{op_name}_sm90.jsonl.gz", mgr)
    op, arch = mgr.op(op_name), mgr.arch(oracle.header["arch"])
    tuned_data.clear_cache()
    model = ranker.model_for(op, arch.name, oracle.header["backend"])
    assert model is not None, f"no shipped {op_name} ranker for {arch.name}"
    return op_name, op, arch, model, oracle


def test_held_out_shapes_include_whole_families_absent_from_training(recorded):
    _, _, _, _, oracle = recorded
    train = {s.family for s in oracle.split("train")}
    held = oracle.split("heldout")
    assert len(held) >= 0.25 * len(oracle.shapes)
    assert {s.family for s in held} - train, "some held-out family must be unseen in training"


def test_the_shipped_ranker_generalises_and_random_picks_do_not(recorded):
    op_name, op, arch, model, oracle = recorded
    held = oracle.split("heldout")
    geo, p10 = FLOOR[op_name]
    got = select_data.summary(select_data.evaluate(held, select_data.ranker_selector(model, op, arch)))
    assert got["geomean"] >= geo and got["p10"] >= p10, got
    old = select_data.summary(select_data.evaluate(held, select_data.heuristic_selector(op, arch)))
    assert got["geomean"] > old["geomean"], (got, old)
    for seed in range(3):   # the floor is one a random pick does not clear
        rnd = select_data.summary(select_data.evaluate(held, select_data.random_selector(seed)))
        assert rnd["geomean"] < geo, rnd


def test_a_ranker_that_inverts_its_predictions_fails_the_floor(recorded):
    op_name, op, arch, model, oracle = recorded

    def worst_first(problem, keys):
        pred = ranker.predict(model, op, problem, keys, arch)
        return keys[int(pred.argmax())]
    got = select_data.summary(select_data.evaluate(oracle.split("heldout"), worst_first))
    assert got["geomean"] < FLOOR[op_name][0]


@pytest.mark.timing
def test_selection_of_a_new_problem_is_fast(recorded):
    op_name, op, arch, model, oracle = recorded
    shapes = oracle.split("heldout")
    best = float("inf")
    for _ in range(5):   # the best of five rounds: a busy CI machine's noise is not the ranker's cost
        t = time.perf_counter()
        for s in shapes:
            ranker.rank(model, op, s.problem, list(s.keys), arch)
        best = min(best, (time.perf_counter() - t) / len(shapes))
    assert best < SELECT_MS[op_name] * 1e-3, f"{best * 1e3:.3f} ms per problem"


def test_the_ranker_file_says_where_it_came_from(recorded):
    op_name, _, arch, _, oracle = recorded
    t = tuned_data.table(op_name, arch.name, ranker.TABLE)
    prov = t.provenance_of((oracle.header["backend"],))
    assert "select_train" in prov["command"] and "H100" in prov["device"] and prov["date"]


def test_ck_select_report_writes_csv_and_png(recorded, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from ck_core.cli import main

    op_name, _, _, _, oracle = recorded
    out_csv, png = tmp_path / "r.csv", tmp_path / "r.png"
    assert main(["select", "report", op_name, "--data", str(DATA / f"{op_name}_sm90.jsonl.gz"), "--csv",
                 str(out_csv), "--png", str(png), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["shapes"] == len(oracle.split("heldout")) and {"ranker", "heuristic", "random"} <= set(res["summary"])
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == res["shapes"]
    assert all(0.0 <= float(r["ranker_score"]) <= 1.0 for r in rows)
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_report_without_data_says_what_to_pass(tmp_path, monkeypatch, capsys):
    from ck_core import select_report
    from ck_core.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(select_report, "data_dirs", lambda: [tmp_path / select_report.DEFAULT_DIR])
    assert main(["select", "report", "gemm"]) == 2
    assert "--data" in capsys.readouterr().err


def test_report_runs_from_any_directory(tmp_path, monkeypatch, capsys):
    """Not only from the repository root: the checkout's recorded oracle is found from elsewhere."""
    from ck_core import select_report
    from ck_core.cli import main

    monkeypatch.chdir(tmp_path)
    if not any(d.is_dir() for d in select_report.data_dirs()):
        pytest.skip("no source checkout with recorded oracles (an installed wheel)")
    assert main(["select", "report", "conv", "--split", "heldout"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "conv on " in out and "heuristic" in out, out
    assert not list(tmp_path.iterdir())   # nothing written where it was not asked for


def test_the_shipped_store_answers_the_tuned_gemm_shapes_before_the_ranker():
    pytest.importorskip("ck_gemm")
    from ck_core.api import dispatcher_for
    from ck_gemm.problem import GemmProblem

    tuned_data.clear_cache()
    store = tuned_data.table("gemm", "sm90", "kernels")
    d = dispatcher_for("gemm", "sm90", "triton", dtypes=("bf16",), layouts=("rcr",), dtypes_c=("bf16",),
                       num_ds=(0,), d_ops=("add",), activations=("none",))
    for m, n, k in ((4096, 4096, 4096), (16, 4096, 4096)):
        p = GemmProblem(m, n, k, dtype="bf16")
        want = next(v["kernel"] for key, v in store.items() if key[1].endswith(f",{m},{n},{k}]") and "bf16" in key[1]
                    and '"rcr"' in key[1])
        assert d.rank(p)[0].name == want and d._rule == "tuning table"
    d.rank(GemmProblem(1, 4096, 11008, dtype="bf16"))   # no measured bucket: the ranker
    assert "learned ranker" in d._rule
