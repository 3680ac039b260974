"""The broad GEMM benchmark suite: deterministic cases that cover what it claims."""
import pytest

from ck_gemm import bench_broad as gb
from ck_gemm.problem import GemmProblem


def _problem(c):
    kw = dict(m=c["m"], n=c["n"], k=c["k"], dtype=c["dtype"], layout=c["layout"])
    if c["batch"] > 1:
        kw["batch"] = c["batch"]
    return GemmProblem(**kw)


def test_cases_deterministic_and_broad():
    cs = gb.cases()
    assert cs == gb.cases() and cs != gb.cases(seed=3)
    kinds = {c["kind"].split(":")[0] for c in cs}
    assert kinds == {"llm", "odd", "batched", "fp8"}
    # the fp8 rows come from their own generator: the bf16/fp16 rows are those of earlier runs
    assert gb.cases(n_fp8=0) == [c for c in cs if c["dtype"] != "fp8"]
    fp8 = [c for c in cs if c["dtype"] == "fp8"]
    assert len(fp8) >= 8 and {c["layout"] for c in fp8} == {"rcr"} and all(c["kind"].startswith("fp8:") for c in fp8)
    layers = {c["kind"].split(":")[2] for c in cs if c["kind"].startswith("llm")}
    assert {"qkv", "o", "up", "down", "vocab"} <= layers
    assert min(c["m"] for c in cs) <= 4 and max(c["m"] for c in cs) >= 8192
    assert {c["layout"] for c in cs} == {"rcr", "rrr"} and {c["dtype"] for c in cs} == {"bf16", "fp16", "fp8"}
    assert any(c["m"] % 2 and c["n"] % 2 and c["k"] % 2 for c in cs)  # odd sizes
    held = [c for c in cs if c["split"] == "heldout"]
    assert len(held) >= len(cs) // 5
    # whole model configs are held out, never seen in training
    for name in gb.HELD_OUT_MODELS:
        assert all(c["split"] == "heldout" for c in cs if f":{name}:" in c["kind"])


def test_every_case_is_a_valid_problem():
    for c in gb.cases():
        p = _problem(c)
        assert p.flops() == 2.0 * c["batch"] * c["m"] * c["n"] * c["k"]


@pytest.mark.slow
def test_every_case_has_an_sm90_kernel():
    from ck_core import Registry

    regs = {}
    for c in gb.cases():
        key = (c["dtype"], c["layout"])
        if key not in regs:
            regs[key] = Registry.from_enumeration("gemm", "sm90", "triton", dtypes=[c["dtype"]], layouts=[c["layout"]])
        assert regs[key].candidates(_problem(c), "triton"), c["case"]


def test_summary_keeps_fp8_rows_apart():
    rows = [dict(case="a", dtype="bf16", split="train", status="ok", ratio_graph=0.5, gflop=2.0),
            dict(case="b", dtype="fp8", split="train", status="ok", ratio_graph=2.0, gflop=2.0),
            dict(case="c", dtype="fp16", split="heldout", status="ok", ratio_graph=0.8, gflop=0.1)]
    s = gb.summary(rows)
    assert s["all"]["n"] == 2 and s["train"]["n"] == 1 and s["fp8"]["n"] == 1
    assert s["fp8"]["graph_geomean"] == pytest.approx(2.0) and s["train"]["graph_min"] == 0.5
    assert s["all"]["graph_geomean"] == pytest.approx((0.5 * 0.8) ** 0.5, rel=1e-3)


def test_broad_result_keeps_wrong_rows_out_of_the_ratios():
    from ck_core.bench import broad_result, stamp

    rows = [dict(case="a", status="ok", ratio=0.9, ours=1.0, peer=1.1, peer_name="p", unit="u"),
            dict(case="b", status="wrong", ratio=None, rel_err=0.5),
            dict(case="c", status="ok", ratio=None),  # ran, but its peer failed: no ratio
            dict(case="d", status="error", error="boom")]
    res = broad_result({"rows": rows, "summary": {"all": {"n": 4}}, "seed": 1, "skipped_for_time": ["e"]})
    assert [r["case"] for r in res["rows"]] == ["a"]
    assert [r["case"] for r in res["extra"]["failed"]] == ["b", "c", "d"]
    assert stamp(res)["geomean"] == pytest.approx(0.9)
