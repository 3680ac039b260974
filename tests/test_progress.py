"""ck_core.progress.Progress (the counter of `ck bench --suite broad` and `ck sweep`): a periodic
one-line update on a stream that is not a terminal, nothing when quiet, counting loops that
`continue`; the -q flags of ck bench and ck sweep."""
from __future__ import annotations

import io
import random
import time

from ck_core.cli import build_parser
from ck_core.progress import Progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_lines_when_not_a_terminal():
    out = io.StringIO()
    n = random.randint(5, 9)
    p = Progress(n, "ck bench fmha --suite broad", every=0.05, stream=out)
    assert p.mode == "lines"
    seen = []
    for i in p.each(range(n), lambda i: f"case{i}"):
        if i == 2:
            continue  # skipped cases count as done too
        time.sleep(0.03)
        seen.append(i)
    lines = out.getvalue().splitlines()
    assert len(seen) == n - 1 and p.n == n
    assert lines and all(ln.startswith("ck bench fmha --suite broad: ") for ln in lines)
    assert any("elapsed" in ln and "last: case" in ln for ln in lines[:-1])
    assert lines[-1].startswith(f"ck bench fmha --suite broad: {n}/{n} cases (100%)") and "in all" in lines[-1]
    time.sleep(0.15)  # closed: no more lines
    assert out.getvalue().splitlines() == lines


def test_quiet_and_knob_silence_it(monkeypatch):
    out = io.StringIO()
    with Progress(3, "x", quiet=True, every=0.01, stream=out) as p:
        for _ in range(3):
            time.sleep(0.02)
            p.update()
    assert p.mode == "off" and out.getvalue() == ""
    monkeypatch.setenv("CK_PROGRESS", "0")
    assert Progress(3, "x", every=0.01, stream=_Tty()).mode == "off"


def test_short_run_prints_nothing():
    out = io.StringIO()
    for _ in Progress(4, "x", every=30, stream=out).each(range(4)):
        pass
    assert out.getvalue() == ""


def test_bar_on_a_terminal():
    out = _Tty()
    p = Progress(2, "ck sweep: bench", unit="row", every=0.01, stream=out)
    assert p.mode == "bar"
    p.update(label="a")
    p.update(label="b")
    p.close()
    assert "ck sweep: bench" in out.getvalue()


def test_progress_line_estimates_time_left():
    p = Progress(10, "d", quiet=True)
    p._t0 -= 40.0
    p.update(4, label="c4")
    ln = p.line()
    assert ln.startswith("d: 4/10 cases (40%), 40s elapsed, ~1m00s left") and ln.endswith("last: c4")


def test_quiet_flags_parse():
    a = build_parser().parse_args(["bench", "fmha", "--suite", "broad", "-q"])
    assert a.quiet and a.suite == "broad"
    assert not build_parser().parse_args(["bench", "gemm"]).quiet
    for flag in ("-q", "--quiet", "--no-progress"):
        assert build_parser().parse_args(["sweep", "gemm", flag]).no_progress


def test_ck_bench_hands_the_suite_a_counter(monkeypatch, tmp_path, capsys):
    """run_bench gives the op's suite options['progress'], quiet under -q; the suite's count shows on stderr."""
    import types

    import ck_core.bench as bench
    import ck_core.plugins as plugins

    got = {}

    def suite(peer, options):
        got["options"] = options
        counter = options["progress"](3, "ck bench fake --suite broad", every=0.02)
        for c in counter.each(["a", "b", "c"]):
            time.sleep(0.03)
        return {"rows": [dict(case="a", ours=1.0, peer=2.0, peer_name="p", unit="ms", ratio=2.0)]}

    fake = types.SimpleNamespace(op=lambda name: types.SimpleNamespace(bench=suite))
    monkeypatch.setattr(plugins, "get_manager", lambda: fake)
    monkeypatch.setattr(bench, "_gpu_visible", lambda: (True, ""))
    for quiet in (False, True):
        args = build_parser().parse_args(["bench", "fake", "--suite", "broad", "--json", str(tmp_path / "r.json")]
                                         + (["-q"] if quiet else []))
        assert bench.run_bench("fake", args, {}) == 0
        err = capsys.readouterr().err
        assert got["options"]["suite"] == "broad"
        assert ("ck bench fake --suite broad: 3/3 cases (100%)" in err) is (not quiet)
        assert (err == "") is quiet
