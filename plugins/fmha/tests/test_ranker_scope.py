"""The shipped sm90 FMHA ranker was fitted on forward timings only: it ranks forward keys, and the
backward's keys keep the measured tables' order (the heuristic), as its domain says."""
import types

import numpy as np
import pytest

from ck_core import select_train
from ck_core.dispatcher import Dispatcher
from ck_core.registry import Registry
from ck_fmha import heuristics
from ck_fmha.api import _FAMILIES
from ck_fmha.problem import FmhaProblem


@pytest.fixture(scope="module")
def disp():
    reg = Registry.from_enumeration("fmha", "sm90", "triton", families=_FAMILIES, dtypes=("fp16",),
                                    hdims=((128, 128),))
    return Dispatcher(reg, backend="triton", tuning=None, check_backend=False)


def _problem(family, **kw):
    base = dict(batch=2, nhead_q=32, nhead_k=8, seqlen_q=2048, seqlen_k=2048, hdim_q=128, hdim_v=128,
                dtype="fp16", mask="top_left")
    return FmhaProblem(family=family, **dict(base, **kw))


@pytest.mark.parametrize("mask,s", [("top_left", 2048), ("none", 2048), ("top_left", 3451)])
def test_backward_keys_follow_the_tables_not_the_forward_ranker(disp, mask, s):
    p = _problem("bwd_dq_dk_dv", mask=mask, seqlen_q=s, seqlen_k=s, deterministic=True)
    key = disp.select(p)
    assert "ranker" not in disp._rule
    cands = disp.registry.candidates(p, backend="triton")
    assert len(cands) > 2
    assert key == heuristics.rank(p, cands, disp.arch)[0]


def test_forward_keys_still_get_the_ranker(disp):
    disp.select(_problem("fwd", lse=True, logits_soft_cap=30.0))   # (no Gluon key takes a soft cap)
    assert "ranker" in disp._rule


@pytest.mark.parametrize("s", [2048, 3451])
def test_forward_lists_with_a_gluon_key_follow_the_tables(disp, s, monkeypatch):
    """No training shape measured a Gluon key (the model's kernel_domain says v_gluon 0): a
    shortlist holding one is ordered by the tables, which put the tuned Gluon key first."""
    from ck_fmha.backends.triton.keys import GLUON_VARIANTS

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    disp._selected.clear()
    key = disp.select(_problem("fwd", lse=True, seqlen_q=s, seqlen_k=s))
    assert "ranker" not in disp._rule
    assert key.algorithm.variant in GLUON_VARIANTS
    assert disp.ranker(disp.mgr.op("fmha")).kernel_domain.get("v_gluon") == (0.0, 0.0)


def test_domain_bounds_problem_class_indicators_exactly():
    def feats(problem, keys, arch):
        n = len(keys)
        return {"is_fwd": np.full(n, problem["fwd"]), "log_s": np.full(n, problem["s"]),
                "hdim": np.full(n, 64.0), "tile": np.arange(n, dtype=float)}

    op = types.SimpleNamespace(features=feats)
    shapes = [types.SimpleNamespace(problem=dict(fwd=1.0, s=s), keys=(1, 2)) for s in (3.0, 7.0)]
    dom = select_train.domain(op, None, shapes)
    assert dom["is_fwd"] == [1.0, 1.0]
    assert dom["log_s"] == [3.0 - select_train.MARGIN, 7.0 + select_train.MARGIN]
    assert "hdim" not in dom and "tile" not in dom
