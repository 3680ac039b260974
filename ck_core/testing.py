"""A test kit for plugin authors: a fake arch, fresh random generators, a reference check.

Use from a plugin's ``conftest.py``::

    pytest_plugins = ["ck_core.testing"]

Every test session gets a private, temporary ``CK_CACHE_DIR``, ``CK_TUNING_DB`` and
``XDG_CACHE_HOME`` (set before collection, removed at the end), so no test reads
or writes the user's real cache, even one that unsets ``CK_CACHE_DIR``.

Fixtures: ``ck_rng`` (a fresh generator; its seed is printed on failure),
``fake_arch`` (an ArchSpec any op can enumerate on), ``ck_manager`` (a plugin
manager with the fake arch added), ``ck_dispatch_log`` (like ``ck_manager``,
plus a :class:`DispatchLog` of every Dispatcher run, with CPU tensors of the
public APIs dispatching on the fake arch), and the helpers
:func:`check_against_reference` (op plugins) and :func:`check_arch_plugin`
(arch plugins).
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import types

import numpy as np
import pytest

from .hookspecs import hookimpl
from .records import ArchSpec


def make_fake_arch(name: str = "fake64", warp_size: int = 64, lds_bytes: int = 65536) -> ArchSpec:
    return ArchSpec(
        name=name, vendor="other", family="test", warp_size=warp_size, lds_bytes=lds_bytes,
        compute_units=8, dtypes=("fp16", "bf16", "fp32", "fp8", "bf8", "int8"),
        warp_tiles={d: ((32, 32, 8), (16, 16, 16)) for d in ("fp16", "bf16", "fp32", "int8", "fp8", "bf8")},
        wave_layouts=((2, 2, 1), (1, 4, 1)), pipelines=("mem", "compv3", "compv4"),
        pipeline_lds_limit={"mem": lds_bytes, "compv3": lds_bytes, "compv4": lds_bytes},
        extras={"gemm": {"tiles_mn": (64, 128), "tile_k_bytes": (64,)}},
        description="a fake arch for tests",
    )


def arch_plugin(*archs: ArchSpec):
    """A plugin object registering ``archs`` (pass it to ``PluginManager(plugins=[...])``)."""
    mod = types.ModuleType(f"ck_test_arch_{'_'.join(a.name for a in archs)}")

    @hookimpl
    def ck_register_archs():
        return list(archs)

    mod.ck_register_archs = ck_register_archs
    return mod


_SESSION_ENV = ("CK_CACHE_DIR", "CK_TUNING_DB", "XDG_CACHE_HOME", "TRITON_CACHE_DIR")


def pytest_configure(config):
    if getattr(config, "_ck_test_env", None) is not None:
        return
    tmp = tempfile.mkdtemp(prefix="ck-test-")
    config._ck_test_env = (tmp, {k: os.environ.get(k) for k in _SESSION_ENV})
    os.environ["CK_CACHE_DIR"] = os.path.join(tmp, "ck-cache")
    os.environ["CK_TUNING_DB"] = os.path.join(tmp, "tuning.json")
    os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "xdg-cache")
    # Triton's own compile cache (~/.triton by default) is a user cache too
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton-cache")


def pytest_unconfigure(config):
    state = getattr(config, "_ck_test_env", None)
    if state is None:
        return
    tmp, saved = state
    config._ck_test_env = None
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def ck_rng(request):
    seed = int(os.environ.get("CK_TEST_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("seed", seed))
    sys.stderr.write(f"[ck] {request.node.name}: seed {seed} (set CK_TEST_SEED to replay)\n")
    return np.random.default_rng(seed)


@pytest.fixture
def fake_arch():
    return make_fake_arch()


@pytest.fixture
def ck_manager(fake_arch, monkeypatch):
    from . import plugins

    mgr = plugins.PluginManager(plugins=[arch_plugin(fake_arch)])
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    return mgr


class DispatchLog:
    """A plugin recording each Dispatcher run: ``(problem, plan's kernel names, launched names)``."""

    def __init__(self):
        self.runs: list = []
        self.manager = None

    @hookimpl
    def ck_after_run(self, problem, plan, launched):
        self.runs.append((problem, tuple(s.key.name for s in plan.stages), tuple(launched)))

    def take(self) -> list:
        """The runs recorded since the last take."""
        runs, self.runs = self.runs, []
        return runs


@pytest.fixture
def ck_dispatch_log(fake_arch, monkeypatch):
    from . import plugins

    log = DispatchLog()
    log.manager = plugins.PluginManager(plugins=[arch_plugin(fake_arch), log])
    monkeypatch.setattr(plugins, "_MANAGER", log.manager)
    monkeypatch.setenv("CK_CPU_ARCH", fake_arch.name)
    return log


def check_against_reference(dispatcher, problem, rng, poison: bool = True):
    """Run ``problem`` through ``dispatcher`` on fresh inputs; return the validation report."""
    from .validate import compare_all

    mgr = dispatcher.mgr
    op = mgr.op(problem.op)
    inputs = op.make_inputs(problem, rng)
    ref = op.reference(problem, inputs)
    backend = dispatcher.backend_spec
    moved = {k: backend.to_backend(v) for k, v in inputs.items()}
    outs = dispatcher.run_dict(problem, moved)
    missing = [k for k in ref if outs.get(k) is None]
    if missing:
        from .errors import ValidationFailed

        raise ValidationFailed(f"{problem.op}: the plan produced no {', '.join(map(repr, missing))}, which the "
                               f"reference computes for this problem (produced: {', '.join(sorted(outs))})")
    got = {k: backend.to_numpy(outs[k]) for k in ref}
    tol = op.tolerance(problem) if op.tolerance else {}
    dtypes = {k: getattr(problem, "dtype_c", getattr(problem, "dtype", "fp32")) for k in ref}
    return compare_all(got, ref, dtypes, tol)


def check_arch_plugin(spec: ArchSpec, *, plugin, name: str, vendor: str, target: tuple,
                      warp_size: int, lds_bytes: int, pipelines=None,
                      distribution: str | None = None, ops=None) -> dict:
    """Assert what every arch plugin must satisfy; return each checked op's keys.

    ``spec`` is the plugin's record, ``plugin`` the module holding its
    ``ck_register_archs`` hook; the keywords are the facts the record must
    state (``pipelines``: the exact set, when given; ``distribution``: the pip
    name, ``ck-arch-<name>`` by default).  Checks the record's shape and
    consistency, its Triton target, its entry point (when pip-installed), and
    the kernel space each installed op plugin (``ops``: those op names, default
    all installed) enumerates on it: non-empty, dtypes among the arch's, every
    key legal, names unique and round-tripping.

    Every check that can run runs; what cannot (no triton, an op plugin not
    installed, plugin not pip-installed) is named in one ``pytest.skip`` at the end.
    """
    from importlib import metadata

    from .key import KernelKey
    from .plugins import PluginManager
    from .registry import enumerate_keys

    unchecked = []
    # -- the record
    assert isinstance(spec, ArchSpec), type(spec)
    assert (spec.name, spec.vendor, spec.warp_size, spec.lds_bytes) == (name, vendor, warp_size, lds_bytes)
    assert spec.compute_units > 0 and spec.description and spec.family
    assert spec.dtypes and set(spec.warp_tiles) == set(spec.dtypes)
    for dtype, tiles in spec.warp_tiles.items():
        assert tiles and all(len(t) == 3 and min(t) > 0 for t in tiles), dtype
    assert spec.wave_layouts and all(len(w) == 3 and min(w) > 0 for w in spec.wave_layouts)
    assert len(set(map(tuple, spec.wave_layouts))) == len(spec.wave_layouts), "repeated wave layout"
    assert spec.pipelines and set(spec.pipeline_lds_limit) == set(spec.pipelines)
    if pipelines is not None:
        assert set(spec.pipelines) == set(pipelines)
    assert all(0 < v <= spec.lds_bytes for v in spec.pipeline_lds_limit.values())
    if "fmha" in spec.extras:
        assert set(spec.extras["fmha"]["hdims"]) <= set(spec.extras["fmha"]["dtypes"])
    assert spec.peak["fp16_tflops"] > 0 and spec.peak["mem_gbs"] > 0
    assert spec.summary()["name"] == name

    class _OtherOp:
        op = "not-an-op"

    assert spec.reject(_OtherOp()) is None, "arch rules must ignore keys of ops they do not know"
    # -- the hook registers this record
    registered = plugin.ck_register_archs()
    assert [a.name for a in registered] == [name]
    assert registered[0].summary() == spec.summary()
    # -- Triton target
    assert spec.triton_target == tuple(target)
    try:
        import triton  # noqa: F401
    except ImportError:
        unchecked.append("gpu_target (no triton)")
    else:
        gpu = spec.gpu_target()
        assert (gpu.backend, gpu.arch, gpu.warp_size) == tuple(target)
    # -- entry point
    eps = [ep for ep in metadata.entry_points(group="ck_core.archs") if ep.name == name]
    if eps:
        assert len(eps) == 1, [ep.value for ep in eps]
        assert eps[0].value == plugin.__name__
        assert eps[0].dist.name == (distribution or f"ck-arch-{name}")
    else:
        unchecked.append(f"entry point (ck-arch-{name} is not pip-installed)")
    # -- the kernel space of each op plugin
    mgr = PluginManager(plugins=[plugin])
    wanted = list(ops) if ops is not None else sorted(mgr.ops())
    spaces = {}
    for op in wanted:
        if op not in mgr.ops():
            unchecked.append(f"the {op} space (its op plugin is not installed)")
            continue
        keys = enumerate_keys(op, name, manager=mgr)
        assert keys, f"no {op} kernel is legal on {name}"
        assert {k.fields["dtype"] for k in keys if "dtype" in k.fields} <= set(spec.dtypes)
        assert len({k.name for k in keys}) == len(keys), "two keys share a name"
        for k in keys:
            assert k.arch == name
            assert spec.reject(k) is None, k.name
        for k in keys[:: max(1, len(keys) // 200)]:
            assert KernelKey.from_name(k.name, manager=mgr) == k
        spaces[op] = keys
    if unchecked:
        pytest.skip("all else checked; not checked: " + "; ".join(unchecked))
    return spaces
