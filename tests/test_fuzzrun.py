"""ck_core.fuzzrun: a line per case, every mismatch reported, a budget that stops drawing cases,
and no silent pass with zero cases."""
import time

import pytest

from ck_core.fuzzrun import budget_s, run_cases


def _run(cases, one, **kw):
    lines = []
    ran = run_cases("t", cases, one, seed=7, printer=lines.append, **kw)
    return ran, lines


def test_every_mismatch_is_reported_with_what_reproduces_it():
    def one(case, info):
        info["key"] = f"k{case['i']}"
        if case["i"] == 2:
            raise RuntimeError("boom")
        return "off" if case["i"] % 2 else None

    lines = []
    with pytest.raises(AssertionError) as e:
        run_cases("t", [{"i": i} for i in range(5)], one, seed=7, printer=lines.append)
    msg = str(e.value)
    assert "3 mismatches" in msg
    for i in (1, 2, 3):
        assert f"seed=7 case={i} (CK_FUZZ_CASE={i}) key=k{i}" in msg
    assert "raised RuntimeError: boom" in msg
    assert len([s for s in lines if s.startswith("[t ")]) == 5   # one line per case, the run went on


def test_budget_stops_drawing_cases_and_says_so():
    def one(case, info):
        time.sleep(0.05)

    ran, lines = _run([{}] * 50, one, budget=0.12)
    assert 1 <= ran < 50
    assert f"{ran} of 50 cases ran" in lines[-1] and "not run" in lines[-1]


def test_zero_cases_is_not_a_pass():
    with pytest.raises(AssertionError, match="no case ran"):
        _run([], lambda case, info: None)


def test_budget_env_and_single_case(monkeypatch):
    monkeypatch.setenv("CK_FUZZ_BUDGET_S", "3.5")
    assert budget_s(90) == 3.5
    monkeypatch.setenv("CK_FUZZ_BUDGET_S", "")
    assert budget_s(90) == 90
    monkeypatch.setenv("CK_FUZZ_CASE", "3")
    seen = []
    ran, _ = _run([{"i": i} for i in range(6)], lambda c, info: seen.append(c["i"]))
    assert ran == 1 and seen == [3]
