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
    assert kinds == {"llm", "odd", "batched", "fp8", "linear_train"}
    # the fp8 rows come from their own generator: the bf16/fp16 rows are those of earlier runs
    assert gb.cases(n_fp8=0) == [c for c in cs if c["dtype"] != "fp8"]
    fp8 = [c for c in cs if c["dtype"] == "fp8"]
    assert len(fp8) >= 8 and {c["layout"] for c in fp8} == {"rcr"} and all(c["kind"].startswith("fp8:") for c in fp8)
    layers = {c["kind"].split(":")[2] for c in cs if c["kind"].startswith("llm")}
    assert {"qkv", "o", "up", "down", "vocab"} <= layers
    assert min(c["m"] for c in cs) <= 4 and max(c["m"] for c in cs) >= 8192
    assert {c["layout"] for c in cs} == set(gb.LAYOUTS) and {c["dtype"] for c in cs} == {"bf16", "fp16", "fp8"}
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


def test_the_earlier_cases_and_their_split_are_unchanged():
    cs = gb.cases()
    first = gb.cases(with_strata=False)
    assert cs[:len(first)] == first and all(c["layout"] in ("rcr", "rrr") for c in first)


def test_every_stratum_has_cases_and_held_out_shapes_never_train():
    cs = gb.cases()
    assert len({c["case"] for c in cs}) == len(cs)   # names are unique (shards merge by name)
    for st in gb.STRATA:
        assert [c for c in cs if st in gb.strata(c)], st
    for layout in gb.LAYOUTS:
        assert sum(gb.strata(c)[0] == f"layout/{layout}" for c in cs) >= 4
    mid = [c for c in cs if "llm/mid_m" in gb.strata(c)]
    assert len(mid) >= 10 and all(16 <= c["m"] <= 1000 for c in mid)
    lin = [c for c in cs if c["kind"].startswith("linear_train:")]
    assert len(lin) >= 8 and all("kind/linear_train" in gb.strata(c) and not any(
        s.startswith("layout/") for s in gb.strata(c)) for c in lin)

    def shape(c):
        return (c["kind"].split(":")[0], c["m"], c["n"], c["k"], c["batch"], c["dtype"], c["layout"])

    train = {shape(c) for c in cs if c["split"] == "train"}
    assert not [c["case"] for c in cs if c["split"] == "heldout" and shape(c) in train]
    for name in gb.HELD_OUT_MODELS:
        assert all(c["split"] == "heldout" for c in cs if f":{name}:" in c["kind"])
    q = gb.quick_cases(cs)
    assert {s for c in q for s in gb.strata(c)} == {s for c in cs for s in gb.strata(c)} and len(q) <= 12


def test_stored_operands_follow_the_layout_letters():
    torch = pytest.importorskip("torch")
    for layout in gb.LAYOUTS:
        c = dict(m=5, n=7, k=3, batch=1, dtype="fp16", layout=layout)
        a, b, peer = gb._tensors(c, "cpu")
        assert tuple(a.shape) == _problem(c).shape_a() and tuple(b.shape) == _problem(c).shape_b()
        al, bl = gb._logical(a, b, layout)
        assert al.shape == (5, 3) and bl.shape == (3, 7)
        want = al.double() @ bl.double()
        assert float((peer().double() - want).norm() / want.norm()) < 1e-2
        assert a.is_contiguous() and b.is_contiguous()


def test_strata_summary_math_on_synthetic_rows():
    def r(kind, layout, m, g, e, split="train", dtype="bf16"):
        return dict(case=f"{kind}{layout}{m}{g}", kind=kind, layout=layout, m=m, n=64, k=64, batch=1, dtype=dtype,
                    split=split, status="ok", ratio_graph=g, ratio_eager=e, gflop=2.0)

    rows = [r("llm:x:o", "rcr", 100, 0.5, 0.4), r("llm:x:o", "rcr", 5000, 2.0, 1.0), r("odd", "crr", 77, 0.9, 0.9),
            r("linear_train:x:up", "rcr", 64, 0.8, 0.7), r("fp8:x:o", "rcr", 64, 1.5, 1.5, dtype="fp8"),
            dict(case="w", kind="odd", layout="ccr", m=9, n=9, k=9, batch=1, dtype="fp16", split="heldout",
                 status="wrong", rel_err=1.0)]
    s = gb.summary(rows)
    assert s["all"]["n"] == 4 and s["all"]["wrong"] == 1   # no fp8, no training steps
    assert s["all"]["graph_geomean"] == pytest.approx((0.5 * 2.0 * 0.9) ** (1 / 3), abs=1e-4)
    assert s["layout/rcr"]["n"] == 2 and s["layout/rcr"]["graph_min"] == 0.5 and s["layout/rcr"]["eager_min"] == 0.4
    assert s["layout/rcr"]["below_0.85"] == 1
    assert s["llm/mid_m"]["n"] == 1 and s["llm/mid_m"]["graph_geomean"] == 0.5
    assert s["kind/linear_train"]["graph_geomean"] == 0.8 and s["kind/fp8"]["graph_geomean"] == 1.5
    assert s["layout/ccr"]["wrong"] == 1 and s["layout/ccr"]["graph_geomean"] is None
    assert "layout/rrr" not in s


def test_linear_training_step_row_is_checked_before_it_is_timed(monkeypatch):
    import os

    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the kernels in the Triton interpreter")
    import ck_gemm

    monkeypatch.setattr(gb, "eager_and_graph_ms", lambda fn: (fn(), {"eager_ms": 2.0, "graph_ms": 1.0})[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    c = dict(kind="linear_train:t:o", m=33, n=40, k=24, batch=1, dtype="fp16", layout="rcr", split="train")
    row = dict(c)
    gb._linear_row(c, row, "cpu")
    assert row["status"] == "ok" and row["rel_err"] < 2e-2 and row["ratio"] == 1.0
    assert row["gflop"] == round(3 * 2 * 33 * 40 * 24 / 1e9, 3) and "linear" in row["peer_name"]
    # a wrong weight gradient (the forward right) makes the row wrong: never timed
    real = ck_gemm.linear

    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            return y.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 1.5

    monkeypatch.setattr(ck_gemm, "linear", lambda x, w: Bad.apply(real(x, w)))
    row = dict(c)
    gb._linear_row(c, row, "cpu")
    assert row["status"] == "wrong" and "ratio" not in row and "ours_graph_ms" not in row
