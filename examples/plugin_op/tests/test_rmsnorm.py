"""The example op plugin passes the op-plugin test kit, and its numbers are right."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # runs without `pip install -e`

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_core.plugins import PluginManager  # noqa: E402
from ck_core.testing import check_op_plugin  # noqa: E402
from ck_rmsnorm import RmsNormProblem  # noqa: E402
from ck_rmsnorm import plugin  # noqa: E402


def test_rmsnorm_passes_the_op_plugin_kit():
    rng = np.random.default_rng()
    problems = [RmsNormProblem(rows=int(rng.integers(1, 50)), cols=int(rng.integers(1, 3000)), dtype=d)
                for d in ("fp16", "bf16", "fp32")]
    report = check_op_plugin("rmsnorm", plugin=plugin, problems=problems)
    assert report["keys"] > 0 and report["problems"] == 3


def test_the_guides_check():
    check_op_plugin("rmsnorm", plugin=plugin,
                    problems=[RmsNormProblem(rows=7, cols=333, dtype="bf16")])


def test_rmsnorm_runs_odd_sizes_against_float64(ck_rng):
    mgr = PluginManager(plugins=[plugin])
    reg = Registry.from_enumeration("rmsnorm", "gfx942", manager=mgr, dtypes=["fp32"])
    disp = Dispatcher(reg)
    for rows, cols in [(1, 1), (3, 65), (17, 1000), (5, 4096)]:
        p = RmsNormProblem(rows=rows, cols=cols, dtype="fp32")
        x = ck_rng.standard_normal((rows, cols)).astype(np.float32)
        w = ck_rng.uniform(0.5, 1.5, cols).astype(np.float32)
        y = disp.run(p, x, w)
        x64 = x.astype(np.float64)
        want = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
        assert np.linalg.norm(y - want) / np.linalg.norm(want) < 1e-6, (rows, cols)


def test_an_unpadded_key_is_not_offered_a_row_it_cannot_step_over():
    mgr = PluginManager(plugins=[plugin])
    reg = Registry.from_enumeration("rmsnorm", "gfx942", manager=mgr, dtypes=["fp16"])
    cands = reg.candidates(RmsNormProblem(rows=4, cols=1000, dtype="fp16"), "numpy")
    assert cands and all(k.algorithm.pad or 1000 % k.algorithm.block_cols == 0 for k in cands)
    with pytest.raises(Exception, match="dtype"):
        RmsNormProblem(rows=4, cols=8, dtype="int8")
