"""A test kit for plugin authors: a fake arch, fresh random generators, a reference check.

Use from a plugin's ``conftest.py``::

    pytest_plugins = ["ck_core.testing"]

Every test session gets a private, temporary ``CK_CACHE_DIR``, ``CK_TUNING_DB`` and
``XDG_CACHE_HOME`` (set before collection, removed at the end), so no test reads
or writes the user's real cache, even one that unsets ``CK_CACHE_DIR``.

Fixtures: ``ck_rng`` (a fresh generator; its seed is printed on failure),
``fake_arch`` (an ArchSpec any op can enumerate on), ``ck_manager`` (a plugin
manager with the fake arch added), and the helpers :func:`check_against_reference`
(op plugins) and :func:`check_arch_plugin` (arch plugins).
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


_SESSION_ENV = ("CK_CACHE_DIR", "CK_TUNING_DB", "XDG_CACHE_HOME")


def pytest_configure(config):
    if getattr(config, "_ck_test_env", None) is not None:
        return
    tmp = tempfile.mkdtemp(prefix="ck-test-")
    config._ck_test_env = (tmp, {k: os.environ.get(k) for k in _SESSION_ENV})
    os.environ["CK_CACHE_DIR"] = os.path.join(tmp, "ck-cache")
    os.environ["CK_TUNING_DB"] = os.path.join(tmp, "tuning.json")
    os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "xdg-cache")


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
    got = {k: backend.to_numpy(outs[k]) for k in ref}
    tol = op.tolerance(problem) if op.tolerance else {}
    dtypes = {k: getattr(problem, "dtype_c", getattr(problem, "dtype", "fp32")) for k in ref}
    return compare_all(got, ref, dtypes, tol)


def check_arch_plugin(spec: ArchSpec, *, plugin, name: str, vendor: str, target: tuple,
                      warp_size: int, lds_bytes: int, pipelines=None,
                      distribution: str | None = None) -> list:
    """Assert what every arch plugin must satisfy; return its GEMM keys.

    ``spec`` is the plugin's record, ``plugin`` the module holding its
    ``ck_register_archs`` hook; the keywords are the facts the record must
    state (``pipelines``: the exact set, when given; ``distribution``: the pip
    name, ``ck-arch-<name>`` by default).  Checks the record's shape and
    consistency, its Triton target, its entry point (when pip-installed), and
    the GEMM space a :class:`PluginManager` of the ck-gemm plugin and ``plugin``
    enumerates on it: non-empty, every dtype present, every key legal (arch
    rules and GEMM rules), names unique and round-tripping, registries agreeing.

    Every check that can run runs; what cannot (no triton, no ck-gemm, plugin
    not pip-installed) is named in one ``pytest.skip`` at the end.
    """
    from importlib import metadata

    from .key import KernelKey
    from .plugins import PluginManager
    from .registry import Registry, enumerate_keys

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
    # -- the GEMM space
    keys = []
    try:
        from ck_gemm import kernel as gemm, plugin as gemm_plugin
    except ImportError:
        unchecked.append("GEMM enumeration (no ck-gemm)")
    else:
        mgr = PluginManager(plugins=[gemm_plugin, plugin], autoload=False)
        keys = enumerate_keys("gemm", name, manager=mgr)
        assert keys, f"no GEMM kernel is legal on {name}"
        assert {k.signature.dtype for k in keys} == set(spec.dtypes)
        assert len({k.name for k in keys}) == len(keys), "two keys share a name"
        for k in keys:
            assert k.arch == name
            assert gemm.rules_violation(k.signature, k.algorithm, spec) is None, k.name
            assert spec.reject(k) is None, k.name
        dtype = "fp16" if "fp16" in spec.dtypes else spec.dtypes[0]
        reg = Registry.from_enumeration("gemm", name, manager=mgr, dtypes=[dtype], layouts=["rcr"])
        assert len(reg) == sum(1 for k in keys if k.signature.dtype == dtype and k.signature.layout == "rcr")
        for k in keys[:: max(1, len(keys) // 200)]:
            assert KernelKey.from_name(k.name, manager=mgr) == k
    if unchecked:
        pytest.skip("all else checked; not checked: " + "; ".join(unchecked))
    return keys
