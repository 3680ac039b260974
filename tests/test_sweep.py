"""`ck sweep`: kernel sets, testing matrices, both executors, resume, failures, output schema.

Tiny kernel sets and tiny shapes keep this file well under 90 s on two CPU cores.  Numpy
sweeps run in this process (their benchmark workers are spawned processes); ahead-of-time
compile-only sweeps run in a subprocess because the test session runs Triton's interpreter.
"""
import csv
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ck_core import CkError, ConfigError, FilterError, get_manager
from ck_core.cli import main as ck_main
from ck_core.sweep.engine import Options, run_sweep
from ck_core.sweep.kernels import select_kernels
from ck_core.sweep.matrix import load_matrix, parse_matrix
from ck_core.sweep.output import STATUSES, TAIL, columns
from ck_core.sweep.spec import get_spec

for _plugin in ("ck_gemm", "ck_conv", "ck_fmha"):
    pytest.importorskip(_plugin)

ROOT = Path(__file__).resolve().parents[1]
FMHA_CONFIGS = ROOT / "plugins" / "fmha" / "configs"

SHAPES = {
    "gemm": """
        [[shape]]
        name = "odd"
        category = "smoke"
        n = 24
        k = 40
        layout = "rcr"
        dtype = "fp16"
        [shape.expand]
        m = [1, 33]
        [[shape]]
        name = "big"
        category = "full"
        m = 64
        n = 64
        k = 64
        dtype = "fp16"
        layout = "rcr"
    """,
    "conv": """
        [[shape]]
        name = "c3x3"
        category = "smoke"
        N = 1
        C = 8
        K = 8
        input_spatial = [7, 9]
        filter = [3, 3]
        pad_left = [1, 1]
        pad_right = [1, 1]
        dtype = "fp16"
    """,
    "fmha": """
        [[shape]]
        name = "gqa"
        category = "smoke"
        batch = 1
        nhead_q = 4
        nhead_k = 2
        seqlen_q = 17
        seqlen_k = 23
        hdim_q = 32
        dtype = "fp16"
        [[shape]]
        name = "ragged"
        category = "smoke"
        nhead_q = 2
        hdim_q = 32
        dtype = "fp16"
        seqlens_q = [5, 11]
        seqlens_kv = [5, 11]
    """,
}
#: a tiny kernel set per op: enumeration options and a filter
KERNELS = {
    "gemm": ({"dtypes": "fp16", "layouts": "rcr"}, "c.pad_m and c.pad_n and c.pad_k and c.variant == 'tile'"),
    "conv": ({"dtypes": "fp16", "directions": "forward", "ndims": 2}, "c.specialization == 'default'"),
    "fmha": ({"dtypes": "fp16"}, "c.hdim_q == 32 and c.pipeline == 'ptr'"),
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path / "cache"))


def _shapes(tmp_path, op) -> str:
    p = tmp_path / f"{op}_shapes.toml"
    p.write_text(textwrap.dedent(SHAPES[op]))
    return str(p)


def _opts(tmp_path, op, **kw) -> Options:
    enum, flt = KERNELS[op]
    base = dict(op=op, arch="sm90", backend="numpy", enum_options=dict(enum), filter=flt, max_kernels=2,
                shapes=_shapes(tmp_path, op), verify=True, repeat=2, csv=str(tmp_path / f"{op}.csv"),
                json=str(tmp_path / f"{op}.json"), progress=False, workers=1)
    base.update(kw)
    return Options(**base)


def _csv(path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_verified(rows, n_kernels, shapes):
    assert len(rows) == n_kernels * len(shapes), [(r["kernel"], r["problem_name"]) for r in rows]
    assert {r["problem_name"] for r in rows} == set(shapes)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["verified"] == "f64"
        assert 0 <= float(r["rel_err"]) < 1e-2
        assert float(r["latency_ms"]) > 0 and float(r["tflops"]) > 0
        assert r["peer"] in ("", None)   # no peer on the CPU


# -- the kernel set ------------------------------------------------------------------

def test_count_matches_ck_list(capsys):
    cfg = str(FMHA_CONFIGS / "receipt0_fwd.json")
    assert ck_main(["list", "fmha", "--arch", "gfx950", "--config", cfg, "--count"]) == 0
    listed = int(capsys.readouterr().out.strip())
    # the config names its own arch (gfx950) and receipt: no --arch here
    assert ck_main(["sweep", "fmha", "--config", cfg, "--count"]) == 0
    assert int(capsys.readouterr().out.strip()) == listed > 10000


def test_config_receipt_name_and_toml(tmp_path, capsys):
    toml = tmp_path / "ci.toml"
    toml.write_text('variant = "fwd"\narch = "gfx942"\nreceipt = "ck_default"\n'
                    '[trait_config]\ndata_type = { values = ["fp16"] }\npipeline = ["qr_async"]\n'
                    'mask = ["no"]\nbias = ["no"]\nmode = ["batch"]\nlse = [false]\ndropout = [false]\n'
                    'logits = [false]\nsink = [false]\n')
    assert ck_main(["sweep", "fmha", "--config", str(toml), "--count"]) == 0
    n_toml = int(capsys.readouterr().out)
    assert ck_main(["sweep", "fmha", "--arch", "gfx942", "--config", str(FMHA_CONFIGS / "fwd_ci.json"),
                    "--count"]) == 0
    assert int(capsys.readouterr().out) == n_toml > 0


def test_filters_expression_python_and_cap(tmp_path):
    mgr = get_manager()
    spec = get_spec(mgr, "fmha")
    cfg = str(FMHA_CONFIGS / "fwd_ci.json")
    everything = select_kernels(mgr, spec, arch="gfx942", backend="numpy", config=cfg).registry
    pyf = tmp_path / "h128.py"
    pyf.write_text("def filter_config(c):\n    return c.hdim_q == 128 and c.data_type == 'fp16'\n")
    exprs = tmp_path / "h128.txt"
    exprs.write_text("# seed spellings work too\nc.hdim_q == 128\nc.tile_m0 >= 64\n")
    by_py = select_kernels(mgr, spec, arch="gfx942", backend="numpy", config=cfg, filter_file=str(pyf)).registry
    by_txt = select_kernels(mgr, spec, arch="gfx942", backend="numpy", config=cfg, filter_file=str(exprs),
                            filter_expr="c.pad_s == False or c.pad_s == True").registry
    want = [k for k in everything if k.signature.hdim_q == 128]
    assert 0 < len(by_py) < len(everything) and by_py.keys() == want
    assert by_txt.keys() == [k for k in want if k.signature.tile[0] >= 64]
    capped = select_kernels(mgr, spec, arch="gfx942", backend="numpy", config=cfg, max_kernels=3).registry
    assert capped.keys() == everything.keys()[:3]
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(FilterError, match="filter_config"):
        select_kernels(mgr, spec, arch="gfx942", backend="numpy", config=cfg, filter_file=str(bad))
    with pytest.raises(ConfigError, match="no arch"):
        select_kernels(mgr, get_spec(mgr, "gemm"), arch=None, backend="numpy")


def test_matrix_categories_and_errors(tmp_path):
    for op in ("gemm", "conv", "fmha"):
        spec = get_spec(get_manager(), op)
        smoke, full, nightly = (load_matrix(spec.shapes, c) for c in ("smoke", "full", "nightly"))
        assert 0 < len(smoke) < len(full) < len(nightly)
        assert {s.name for s in smoke} <= {s.name for s in full}
        make = spec.make_problem or get_manager().op(op).problem_type.from_dict
        for s in nightly:
            make(dict(s.fields))   # every shipped shape is a valid problem
    with pytest.raises(ConfigError, match="twice"):
        parse_matrix({"shape": [{"name": "a", "m": 1}, {"name": "a", "m": 2}]}, "x.toml")
    with pytest.raises(ConfigError, match="category"):
        parse_matrix({"shape": [{"name": "a", "category": "weekly"}]}, "x.toml")


# -- numpy --verify sweeps, local and Ray ---------------------------------------------

@pytest.mark.parametrize("op", ["gemm", "conv", "fmha"])
def test_local_verify_sweep(tmp_path, op):
    meta = run_sweep(_opts(tmp_path, op))
    rows = _csv(tmp_path / f"{op}.csv")
    shapes = [s.name for s in load_matrix(_shapes(tmp_path, op), "smoke")]
    _check_verified(rows, meta["total_kernels"], shapes)
    assert meta["total_kernels"] == 2
    # CSV schema: the seed's leading columns, then the op's, then the common tail
    header = list(rows[0])
    assert header == columns(get_spec(get_manager(), op)) and header[0] == "problem_name"
    assert header[-len(TAIL):] == list(TAIL)
    if op == "fmha":
        assert header[:10] == ["problem_name", "batch", "seqlen_q", "seqlen_k", "nhead_q", "nhead_k",
                               "hdim_q", "hdim_v", "dtype", "problem_mode"]
        assert {"kernel", "family", "mode", "pipeline", "tile_m0", "tile_n0"} <= set(header)
    doc = json.loads((tmp_path / f"{op}.json").read_text())
    md = doc["metadata"]
    for k in ("arch", "device", "category", "total_kernels", "shapes_benchmarked", "total_measurements",
              "versions", "command", "date"):
        assert k in md, k
    assert md["total_measurements"] == len(rows) == len(doc["results"])
    assert md["shapes_benchmarked"] == len(shapes) and md["category"] == "smoke"


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"TRITON_INTERPRET": "1"}})
    yield ray
    ray.shutdown()


def test_ray_verify_sweep_all_ops(tmp_path, ray_local):
    for op in ("gemm", "conv", "fmha"):
        meta = run_sweep(_opts(tmp_path, op, executor="ray"))
        shapes = [s.name for s in load_matrix(_shapes(tmp_path, op), "smoke")]
        _check_verified(_csv(tmp_path / f"{op}.csv"), 2, shapes)
        assert meta["executor"] == "ray" and meta["ray_cpus"] == 2 and meta["bench_workers"] == 1


def test_ray_timeout_rows(tmp_path, ray_local):
    # a fresh actor's first task may take its set-up time; a later task over 1 ms is a timeout
    # row, and a task still running then has its actor killed and replaced (a fresh one)
    meta = run_sweep(_opts(tmp_path, "gemm", executor="ray", timeout=1e-3, verify=False, repeat=500, json=None))
    rows = _csv(tmp_path / "gemm.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok", "timeout"}
    assert meta["status_counts"]["timeout"] >= 2


# -- resume, failures, timeouts ---------------------------------------------------------

def test_resume_after_an_interrupted_sweep(tmp_path):
    opts = _opts(tmp_path, "gemm", category="full", json=None)
    run_sweep(opts)
    full = _csv(tmp_path / "gemm.csv")
    assert len(full) == 6
    # a killed sweep: the header, two finished rows and a torn third line
    lines = (tmp_path / "gemm.csv").read_text().splitlines(keepends=True)
    (tmp_path / "gemm.csv").write_text("".join(lines[:3]) + lines[3][:25])
    meta = run_sweep(_opts(tmp_path, "gemm", category="full", json=None, resume=True))
    again = _csv(tmp_path / "gemm.csv")
    ids = [(r["kernel"], r["problem_name"]) for r in again]
    assert len(ids) == len(set(ids)) == 6
    assert set(ids) == {(r["kernel"], r["problem_name"]) for r in full}
    assert meta["resumed_rows"] == 2 and all(r["status"] == "ok" for r in again)
    assert again[:2] == full[:2]   # the finished rows are kept, not re-measured


def test_failing_kernel_becomes_a_row(tmp_path, monkeypatch):
    from ck_core.dispatcher import Dispatcher
    from ck_core.sweep.worker import BenchWorker

    worker = BenchWorker("gemm", "sm90", "numpy", verify=True, repeat=1)
    mgr = get_manager()
    reg = select_kernels(mgr, get_spec(mgr, "gemm"), arch="sm90", backend="numpy",
                         options=KERNELS["gemm"][0], filter_expr=KERNELS["gemm"][1], max_kernels=1).registry
    task = {"problem_name": "p", "fields": {"m": 5, "n": 24, "k": 8}, "stages": [reg.keys()[0].to_dict()]}
    assert worker.run(task)["status"] == "ok"

    def broken(self, key):
        def launch(problem, tensors):
            raise RuntimeError("illegal memory access")
        return launch
    monkeypatch.setattr(Dispatcher, "impl", broken)
    worker = BenchWorker("gemm", "sm90", "numpy", verify=True, repeat=1)
    row = worker.run(task)
    assert row["status"] == "error" and "illegal memory access" in row["error"]

    def wrong(self, key):
        def launch(problem, tensors):
            import numpy as np
            return {"c": np.zeros(problem.shape_c(), np.float16)}
        return launch
    monkeypatch.setattr(Dispatcher, "impl", wrong)
    row = BenchWorker("gemm", "sm90", "numpy", verify=True, repeat=1).run(task)
    assert row["status"] == "wrong" and "latency_ms" not in row


def test_compile_failure_and_timeout_rows_do_not_stop_the_sweep(tmp_path, monkeypatch):
    from ck_core import build

    real = build._compile_one
    calls = []

    def flaky(key_dict, *a, **k):
        calls.append(key_dict["name"])
        if len(calls) == 1:
            return key_dict["name"], None, "CompileError: ptxas died"
        return real(key_dict, *a, **k)
    monkeypatch.setattr(build, "_compile_one", flaky)
    # the numpy backend compiles nothing: pretend it does, so the compile stage runs
    nb = get_manager().backend("numpy")
    object.__setattr__(nb, "compile", lambda *a, **k: {})
    try:
        meta = run_sweep(_opts(tmp_path, "gemm", timeout=1e-3, verify=False, json=None, repeat=500))
    finally:
        object.__setattr__(nb, "compile", None)
    rows = _csv(tmp_path / "gemm.csv")
    assert len(rows) == 4 and len(calls) == 2
    by = {}
    for r in rows:
        by.setdefault(r["status"], []).append(r)
    assert len(by["compile_failed"]) == 2 and "ptxas died" in by["compile_failed"][0]["error"]
    assert len(by["timeout"]) == 2     # every task over the 1 ms limit; the sweep went on
    assert set(by) <= set(STATUSES) and meta["status_counts"] == {"compile_failed": 2, "timeout": 2}


# -- ahead-of-time compile-only sweeps (triton), both executors, in a subprocess -------------

COMPILE_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import ray
    from ck_core.sweep.engine import Options, run_sweep
    kernels = json.loads(sys.argv[2])
    out = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for executor in ("local", "ray"):
        os.environ["CK_CACHE_DIR"] = os.path.join(sys.argv[1], executor)
        for op, (enum, flt) in kernels.items():
            csv = os.path.join(sys.argv[1], f"{executor}_{op}.csv")
            meta = run_sweep(Options(op=op, arch="sm90", backend="triton", enum_options=enum, filter=flt,
                                     max_kernels=1 if op != "gemm" else 2, compile_only=True, csv=csv,
                                     workers=2, progress=False, executor=executor))
            out[f"{executor}_{op}"] = {"meta": meta, "csv": open(csv).read()}
    print("RESULT" + json.dumps(out, default=str))
''')


def test_compile_only_sweeps_both_executors(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("ray")
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, str(tmp_path), json.dumps(KERNELS)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT")][-1][6:])
    for name, info in res.items():
        rows = list(csv.DictReader(info["csv"].splitlines()))
        want = 2 if name.endswith("gemm") else 1
        assert len(rows) == want and all(r["status"] == "ok" and float(r["compile_s"]) > 0 for r in rows), rows
        assert all(r["problem_name"] == "" for r in rows)
        assert info["meta"]["compiled"] == want and info["meta"]["cache_hits"] == 0, name


# -- the optional extra --------------------------------------------------------------

def test_ray_missing_is_a_clear_error_fast(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    t0 = time.perf_counter()
    assert ck_main(["sweep", "gemm", "--arch", "sm90", "--executor", "ray", "--compile-only"]) == 4   # 4: unavailable here
    assert time.perf_counter() - t0 < 1.0
    err = capsys.readouterr().err
    assert "ck-core[ray]" in err
    with pytest.raises(CkError, match="ck-core\\[ray\\]"):
        run_sweep(Options(op="gemm", arch="sm90", executor="ray"))


def test_interrupted_sweep_keeps_rows_and_writes_json(tmp_path, monkeypatch):
    from ck_core.sweep.local import LocalExecutor

    def run_then_ctrl_c(self, work, emit, compiled):
        task = next(t for ts in work.tasks.values() for t in ts)
        emit(dict(task["base"], status="ok", latency_ms=1.0))
        self.stats = {"compiled": 0}
        raise KeyboardInterrupt
    monkeypatch.setattr(LocalExecutor, "run", run_then_ctrl_c)
    meta = run_sweep(_opts(tmp_path, "gemm", progress=True))
    doc = json.loads((tmp_path / "gemm.json").read_text())
    assert meta["interrupted"] and doc["metadata"]["interrupted"] and len(doc["results"]) == 1
    assert len(_csv(tmp_path / "gemm.csv")) == 1 and doc["metadata"]["compiled"] == 0


def test_device_check_and_input_cast():
    torch = pytest.importorskip("torch")
    from ck_core.sweep import cast_inputs
    from ck_core.sweep.worker import device_check

    g = torch.Generator().manual_seed(int(time.time()))
    ref = {"c": torch.randn(33, 17, generator=g)}
    ok, rel, _ = device_check({"c": ref["c"].to(torch.bfloat16)}, ref, "bf16", {})
    assert ok and 0 < rel < 1e-2
    poisoned = ref["c"].clone()
    poisoned[3, 5] = float("nan")
    ok, _, text = device_check({"c": poisoned}, ref, "bf16", {})
    assert not ok and "1/561" in text
    ok, rel, _ = device_check({"c": ref["c"] * 1.05}, ref, "fp16", {})
    assert not ok and rel == pytest.approx(0.05, rel=1e-3)
    cast = cast_inputs(("a", "b"), "bf16", {"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.float16),
                                             "d": torch.zeros(2)})
    assert (cast["a"].dtype, cast["b"].dtype, cast["d"].dtype) == (torch.bfloat16, torch.float16, torch.float32)


def test_json_to_stdout(tmp_path, capsys):
    enum, flt = KERNELS["gemm"]
    argv = ["sweep", "gemm", "--arch", "sm90", "--shapes", _shapes(tmp_path, "gemm"), "--filter", flt,
            "--max-kernels", "1", "--json", "-", "--repeat", "1", "--dtypes", enum["dtypes"],
            "--layouts", enum["layouts"]]
    assert ck_main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metadata"]["total_measurements"] == 2 and doc["metadata"]["op"] == "gemm"
