"""`ck sweep --resume` reads untrusted files: hostile resume files, table-driven.

A resumed row stands only if it has the shape this sweep writes (known columns, a status of
STATUSES, finite non-negative numbers, a positive latency for an 'ok' row) and names a
(kernel, shape) pair of this sweep with the same problem and kernel columns; any other row is
reported and measured again, never taken as measured.  A file that cannot be read at all (not
a regular file, not UTF-8, not JSON, too deep) is a ConfigError naming it, and is left as it is.

The executor is replaced by one that "measures" every task it is given with a marker latency,
so each case runs in milliseconds and the test sees exactly which rows were measured again.
"""
import csv
import io
import json
import os
from pathlib import Path

import pytest

from ck_core import CkError
from ck_core.sweep import engine
from ck_core.sweep.engine import Options, run_sweep
from ck_core.sweep.output import STATUSES

pytest.importorskip("ck_gemm")

SHAPES = """
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
"""
FIRST, AGAIN = 1.5, 777.0   # the latencies the fake executor "measures" in the first and the resumed run


class FakeExecutor:
    def __init__(self, latency):
        self.latency = latency
        self.measured = []

    def run(self, work, emit, compiled):
        for k in work.keys:
            for task in work.tasks[k["name"]]:
                self.measured.append((task["base"]["kernel"], task["base"]["problem_name"]))
                emit(dict(task["base"], status="ok", verified="fp64", latency_ms=self.latency, tflops=0.5))
        return {}


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path / "cache"))
    shapes = tmp_path / "shapes.toml"
    shapes.write_text(SHAPES)
    fakes = []

    def run(fmt="csv", resume=False, latency=FIRST, **kw):
        fakes.append(FakeExecutor(latency))
        monkeypatch.setattr(engine, "get_executor", lambda opts: fakes[-1])
        out = str(tmp_path / f"gemm.{fmt}")
        opts = Options(op="gemm", arch="sm90", backend="numpy", enum_options={"dtypes": "fp16", "layouts": "rcr"},
                       filter="c.pad_m and c.pad_n and c.pad_k and c.variant == 'tile'", max_kernels=2,
                       shapes=str(shapes), category="full", csv=out if fmt == "csv" else None,
                       json=out if fmt == "json" else None, progress=False, workers=1, resume=resume, **kw)
        meta = run_sweep(opts, out=io.StringIO())
        return meta, fakes[-1].measured
    return run


def _csv_rows(path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write_csv(path, rows, header=None):
    header = header or list(rows[0])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _ids(rows):
    return [(r["kernel"], r["problem_name"]) for r in rows]


# each case: (name, how to spoil the earlier run's rows (a list of CSV dicts) -> (rows, header), how many
# rows are to be measured again)
def _set(i, **kw):
    def spoil(rows):
        rows[i].update(kw)
        return rows, None
    return spoil


def _foreign_kernel(rows):
    r = dict(rows[0], kernel=rows[0]["kernel"].replace("gemm_", "gemm_x", 1), latency_ms="0.001")
    return rows + [r], None


def _foreign_shape(rows):
    return rows + [dict(rows[0], problem_name="nowhere", latency_ms="0.001")], None


def _extra_column(rows):
    return rows, list(rows[0]) + ["sneaky"]


def _long_line(rows):
    rows[1]["error"] = "x" * 70000
    return rows, None


CSV_CASES = [
    ("fabricated_foreign_kernel", _foreign_kernel, 0),   # not of this set: dropped, nothing to re-measure
    ("fabricated_foreign_shape", _foreign_shape, 0),
    ("status_not_known", _set(0, status="measured"), 1),
    ("status_empty_is_torn", _set(0, status=""), 1),
    ("latency_nan", _set(1, latency_ms="nan"), 1),
    ("latency_inf", _set(1, latency_ms="inf"), 1),
    ("latency_negative", _set(2, latency_ms="-3"), 1),
    ("ok_without_latency", _set(2, latency_ms=""), 1),
    ("tflops_text", _set(3, tflops="fast"), 1),
    ("problem_field_changed", _set(0, m="4096"), 1),
    ("arch_changed", _set(0, arch="gfx942"), 1),
    ("kernel_column_changed", _set(1, tile_m="7"), 1),
    ("unknown_column", _extra_column, 6),
    ("field_too_long", _long_line, 1),
    ("quote_opened_mid_file", lambda rows: ([dict(rows[0], kernel='"' + rows[0]["kernel"])] + rows[1:], None), 1),
    ("duplicate_rows", lambda rows: (rows + rows[:2], None), 0),
]


@pytest.mark.parametrize("name,spoil,again", CSV_CASES, ids=[c[0] for c in CSV_CASES])
def test_hostile_csv_rows_are_measured_again(sweep, tmp_path, name, spoil, again):
    sweep()
    path = tmp_path / "gemm.csv"
    first = _csv_rows(path)
    assert len(first) == 6 and all(float(r["latency_ms"]) == FIRST for r in first)
    rows, header = spoil([dict(r) for r in first])
    _write_csv(path, rows, header)
    if name == "unknown_column":   # every row now carries a column no sweep writes
        for r in rows:
            r["sneaky"] = "1"
        _write_csv(path, rows, header)
    meta, measured = sweep(resume=True, latency=AGAIN)
    final = _csv_rows(path)
    assert sorted(_ids(final)) == sorted(_ids(first))            # each pair once, no foreign row
    assert len(measured) == again and meta["resumed_rows"] == 6 - again
    assert meta["rejected_resume_rows"] >= max(again, 1) or name == "duplicate_rows"
    redone = {(r["kernel"], r["problem_name"]) for r in final if float(r["latency_ms"]) == AGAIN}
    assert redone == set(measured)
    assert all(r["status"] == "ok" and float(r["latency_ms"]) in (FIRST, AGAIN) for r in final)
    assert all(r.get("m") != "4096" and r["arch"] == "sm90" for r in final)


def test_rows_the_plan_writes_itself_are_resumed_too(sweep, tmp_path):
    """'unsupported' rows of shapes too large for host code (kernel '') stand on resume, once."""
    meta, measured = sweep(f64_flops=1e5)
    first = _csv_rows(tmp_path / "gemm.csv")
    big = [r for r in first if r["problem_name"] == "big"]
    assert len(big) == 1 and big[0]["status"] == "unsupported" and big[0]["kernel"] == "" and len(measured) == 4
    meta, measured = sweep(resume=True, f64_flops=1e5, latency=AGAIN)
    assert measured == [], measured
    assert meta["rejected_resume_rows"] == 0, meta
    assert meta["resumed_rows"] == 5, meta
    assert _csv_rows(tmp_path / "gemm.csv") == first


def test_fabricated_ok_rows_are_never_taken_as_measured_json(sweep, tmp_path):
    sweep("json")
    path = tmp_path / "gemm.json"
    doc = json.loads(path.read_text())
    res = doc["results"]
    res[0]["latency_ms"] = float("inf")                     # written as Infinity
    res[1]["status"] = ["ok"]
    res[2] = "ok"
    res[3]["kernel"] = {"name": res[3]["kernel"]}
    res[4]["rel_err"] = -1
    res.append(dict(res[5], problem_name="elsewhere"))
    path.write_text(json.dumps(doc))
    meta, measured = sweep("json", resume=True, latency=AGAIN)
    final = json.loads(path.read_text())["results"]
    assert len(final) == 6 and len(measured) == 5 and meta["resumed_rows"] == 1
    assert all(r["status"] == "ok" and r["latency_ms"] in (FIRST, AGAIN) for r in final)


def test_broken_partial_jsonl_lines_are_measured_again(sweep, tmp_path):
    sweep("json")
    path = tmp_path / "gemm.json"
    rows = json.loads(path.read_text())["results"]
    path.unlink()
    lines = [json.dumps(r) for r in rows[:4]]
    lines[1] = "{not json"
    lines[2] = "[" * 5000 + "]" * 5000
    (tmp_path / "gemm.json.partial.jsonl").write_text("\n".join(lines) + "\n" + json.dumps(rows[4])[:30])
    meta, measured = sweep("json", resume=True, latency=AGAIN)
    assert len(measured) == 4 and meta["resumed_rows"] == 2
    assert len(json.loads(path.read_text())["results"]) == 6


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


FILE_CASES = [
    ("not_utf8", lambda p: p.write_bytes(b"kernel,problem_name,status\n\xff\xfe,x,ok\n"), "UTF-8"),
    ("nul_bytes", lambda p: p.write_bytes(p.read_bytes().replace(b",", b"\x00", 3)), "NUL"),
    ("a_directory", lambda p: (p.unlink(), p.mkdir()), "directory"),
    ("a_fifo", _fifo, "FIFO"),
    ("a_link_to_dev_zero", lambda p: (p.unlink(), p.symlink_to("/dev/zero")), "character device"),
    ("a_csv_field_past_the_csv_limit", lambda p: p.write_text(p.read_text().replace(",ok,", ",ok," + "y" * 200000, 1)),
     "line 2"),
]


@pytest.mark.parametrize("name,spoil,says", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_unreadable_resume_files_are_refused_by_name(sweep, tmp_path, name, spoil, says):
    sweep()
    path = tmp_path / "gemm.csv"
    spoil(path)
    before = path.read_bytes() if path.is_file() and not path.is_symlink() else None
    with pytest.raises(CkError) as err:
        sweep(resume=True, latency=AGAIN)
    assert str(path) in str(err.value) and says in str(err.value)
    if before is not None:
        assert path.read_bytes() == before    # refused, not overwritten


@pytest.mark.parametrize("text,says", [('{"results": {"a": 1}}', "results"), ("[1, 2]", "results"),
                                       ('{"results": ' + "[" * 100 + "]" * 100 + "}", "deep"),
                                       ("{", "not valid JSON")])
def test_unreadable_json_resume_files(sweep, tmp_path, text, says):
    (tmp_path / "gemm.json").write_text(text)
    with pytest.raises(CkError, match=says):
        sweep("json", resume=True)


def test_statuses_are_the_known_ones():
    assert set(STATUSES) == {"ok", "wrong", "compile_failed", "unsupported", "timeout", "error"}
