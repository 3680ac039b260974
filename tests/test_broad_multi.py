"""Broad suites on several GPUs: ``--shard I/N`` splits a suite's cases, benchmarks/broad_multi.py merges
the shards' results (rows in the suite's order, summary over all rows)."""
import importlib.util
import random
from pathlib import Path

import pytest

from ck_core.bench import shard
from ck_core.errors import ConfigError


@pytest.mark.parametrize("n", [1, 3, 4, 7])
def test_shards_cover_every_case_once(n):
    cases = [{"case": f"c{i}"} for i in range(random.randint(5, 40))]
    parts = [shard(cases, f"{i}/{n}") for i in range(n)]
    names = [c["case"] for p in parts for c in p]
    assert sorted(names) == sorted(c["case"] for c in cases) and len(names) == len(set(names))
    assert shard(cases, "") == cases


@pytest.mark.parametrize("spec", ["4/4", "-1/2", "a/b", "1", "0/0"])
def test_bad_shard_spec_says_what_to_give(spec):
    with pytest.raises(ConfigError, match="I/N"):
        shard([{"case": "x"}], spec)


def test_merge_orders_rows_and_recomputes_the_summary():
    pytest.importorskip("ck_gemm")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "broad_multi.py"
    spec = importlib.util.spec_from_file_location("broad_multi", path)
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    from ck_gemm.bench_broad import cases

    cs = cases()
    rng = random.Random()
    ratios = {c["case"]: rng.uniform(0.5, 1.5) for c in cs}
    parts = []
    for i in range(3):
        rows = [dict(c, status="ok", ratio_graph=ratios[c["case"]], ratio_eager=ratios[c["case"]], gflop=2.0)
                for c in shard(cs, f"{i}/3")]
        parts.append({"suite": "broad", "seed": 1, "rows": rows[::-1], "skipped_for_time": [f"s{i}"],
                      "summary": {}, "elapsed_s": 10.0 + i, "device": "d", "date": "x"})
    res = bm.merge("gemm", parts, "cmd")
    assert [r["case"] for r in res["rows"]] == [c["case"] for c in cs]
    assert res["skipped_for_time"] == ["s0", "s1", "s2"] and res["shards"] == 3 and res["elapsed_s"] == 12.0
    import math
    # "all": the GEMMs against torch.matmul (fp8 rows and linear training steps have their own peers)
    for part, keep in (("all", lambda c: c["dtype"] != "fp8" and not c["kind"].startswith("linear_train")),
                       ("fp8", lambda c: c["dtype"] == "fp8"),
                       ("layout/crr", lambda c: c["layout"] == "crr" and c["kind"].split(":")[0] in ("llm", "odd"))):
        vals = [ratios[c["case"]] for c in cs if keep(c)]
        want = math.exp(sum(math.log(v) for v in vals) / len(vals))
        assert res["summary"][part]["n"] == len(vals)
        assert res["summary"][part]["graph_geomean"] == pytest.approx(want, abs=1e-4)
