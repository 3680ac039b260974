"""A kernel that fails to build or load is never the user's problem: the Dispatcher falls back
to its next candidate (logged once per key), and only when none builds does the caller get a
CkError naming every key tried and why.  On the CPU (Triton's interpreter) a key's build failure
is made by replacing ``triton_artifacts.launch`` for the key's kernels."""
import logging
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, Registry  # noqa: E402
from ck_core import dispatcher as dispatcher_mod  # noqa: E402
from ck_core.backends import triton_artifacts  # noqa: E402
from ck_core.errors import CkError, CompileError  # noqa: E402
from ck_core.testing import check_against_reference  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="makes a build fail under TRITON_INTERPRET=1")


@pytest.fixture
def disp(monkeypatch):
    from ck_core import PluginManager, plugins
    from ck_core.testing import arch_plugin, make_fake_arch

    mgr = PluginManager(plugins=[arch_plugin(make_fake_arch())])
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    monkeypatch.setattr(dispatcher_mod, "_WARNED", set())
    reg = Registry.from_enumeration("fmha", "fake64", "triton", dtypes="fp16")
    return Dispatcher(reg, backend="triton")


def _out_of_resources():
    from triton.runtime.errors import OutOfResources

    return OutOfResources(263168, 232448, "shared memory")


def _failing(monkeypatch, bad: set, exc=_out_of_resources):
    """Make every kernel of the keys named in ``bad`` fail to build; returns the names launched."""
    real, launched = triton_artifacts.launch, []

    def launch(name, fn, grid, args, kwargs, **kw):
        key = name.split("/")[0]
        if key in bad:
            raise exc()
        launched.append(key)
        return real(name, fn, grid, args, kwargs, **kw)

    monkeypatch.setattr(triton_artifacts, "launch", launch)
    return launched


P = dict(batch=2, nhead_q=3, nhead_k=3, seqlen_q=23, seqlen_k=41, hdim_q=32, dtype="fp16")


@pytest.mark.parametrize("kw, exc", [
    (dict(family="fwd", mask="top_left"), _out_of_resources),
    (dict(family="bwd_dq_dk_dv", seqlen_k=23, mask="top_left"),
     lambda: CompileError("fmha_x: triton.compile for cuda:90 failed: CompilationError: boom")),
])
def test_next_candidate_runs_when_a_key_does_not_build(disp, monkeypatch, ck_rng, caplog, kw, exc):
    p = FmhaProblem(**{**P, **kw})
    first = disp.plan(p)
    stage = [s for s in first.stages if s.problem.family == kw["family"]][0]
    ranked = [k.name for k in disp.rank(stage.problem)]
    assert len(ranked) >= 2 and ranked[0] == stage.key.name
    launched = _failing(monkeypatch, {stage.key.name}, exc)
    disp.clear_cache()
    with caplog.at_level(logging.WARNING, logger="ck_core.dispatcher"):
        rep = check_against_reference(disp, p, ck_rng)   # fresh random inputs, float64 reference
        assert rep.passed, str(rep)
        again = check_against_reference(disp, p, ck_rng)
        assert again.passed, str(again)
    # the failing key was tried once, then the next candidate ran (and is what the plan names)
    now = disp.plan(p)
    picked = [s.key.name for s in now.stages if s.problem.family == kw["family"]][0]
    assert picked != stage.key.name and picked in ranked and picked in launched
    assert stage.key.name not in launched and stage.key.name in disp.failed
    warned = [r for r in caplog.records if stage.key.name in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING   # once per key
    assert "falling back" in warned[0].getMessage()


def test_run_falls_back_too(disp, monkeypatch, ck_rng):
    """Dispatcher.run (what the public APIs call) falls back as run_dict does; the result is right."""
    p = FmhaProblem(**P, family="fwd")
    bad = disp.select(p).name
    _failing(monkeypatch, {bad})
    q, k, v = (torch.from_numpy(ck_rng.standard_normal(s).astype(np.float16)) for s in
               ((2, 3, 23, 32), (2, 3, 41, 32), (2, 3, 41, 32)))
    disp.clear_cache()
    o = disp.run(p, q, k, v)
    o = o[0] if isinstance(o, tuple) else o
    qd, kd, vd = (t.double() for t in (q, k, v))
    ref = torch.softmax(qd @ kd.transpose(-1, -2) * p.softmax_scale, -1) @ vd
    err = ((o.double() - ref).norm() / ref.norm()).item()
    assert err < 2e-3, err
    assert disp.select(p).name != bad and bad in disp.failed


def test_no_buildable_candidate_is_a_ck_error_naming_the_keys(disp, monkeypatch):
    p = FmhaProblem(**P, family="fwd")
    names = [k.name for k in disp.rank(p)]
    _failing(monkeypatch, set(names))
    disp.clear_cache()
    x = torch.zeros(2, 3, 23, 32, dtype=torch.float16)
    y = torch.zeros(2, 3, 41, 32, dtype=torch.float16)
    with pytest.raises(CkError) as info:
        disp.run(p, x, y, y)
    msg = str(info.value)
    assert isinstance(info.value, CompileError)
    assert all(n in msg for n in names) and "OutOfResources" in msg and "shared memory" in msg


def test_other_errors_are_not_swallowed(disp, monkeypatch):
    """Only build failures fall back: a launcher's other exception reaches the caller unchanged."""
    p = FmhaProblem(**P, family="fwd")

    def boom(*a, **k):
        raise RuntimeError("not a build failure")

    monkeypatch.setattr(triton_artifacts, "launch", boom)
    disp.clear_cache()
    x = torch.zeros(2, 3, 23, 32, dtype=torch.float16)
    y = torch.zeros(2, 3, 41, 32, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="not a build failure"):
        disp.run(p, x, y, y)
    assert not disp.failed


def test_build_failure_classifies():
    from ck_core.dispatcher import build_failure

    assert build_failure(CompileError("x")) and build_failure(_out_of_resources())
    assert not build_failure(RuntimeError("x")) and not build_failure(ValueError("OutOfResources"))


def test_a_build_failure_inside_a_graph_capture_marks_nothing_failed(disp, monkeypatch, ck_rng):
    """A kernel that fails to build or load while a CUDA graph is captured failed for the capture's sake
    (compiles and module loads are not capturable): the key is not marked failed, no other candidate is
    compiled inside the capture, and the CkError says to run the call once first.  Outside the capture
    the same key then runs (it was never a bad key)."""
    p = FmhaProblem(**P, family="fwd", mask="top_left")
    key = disp.plan(p).stages[0].key.name
    _failing(monkeypatch, {key})
    disp.clear_cache()
    monkeypatch.setattr(dispatcher_mod, "capturing", lambda: True)
    with pytest.raises(CkError, match="while a CUDA graph was being captured.*Run this call once before"):
        check_against_reference(disp, p, ck_rng)
    assert disp.failed == {}
    monkeypatch.setattr(triton_artifacts, "launch", _REAL_LAUNCH)
    monkeypatch.setattr(dispatcher_mod, "capturing", lambda: False)
    assert check_against_reference(disp, p, ck_rng).passed
    assert disp.plan(p).stages[0].key.name == key and disp.failed == {}


_REAL_LAUNCH = triton_artifacts.launch
