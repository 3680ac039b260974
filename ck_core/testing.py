"""A test kit for plugin authors: a fake arch, fresh random generators, a reference check.

Use from a plugin's ``conftest.py``::

    pytest_plugins = ["ck_core.testing"]

Fixtures: ``ck_rng`` (a fresh generator; its seed is printed on failure),
``fake_arch`` (an ArchSpec any op can enumerate on), ``ck_manager`` (a plugin
manager with the fake arch added), and the helper :func:`check_against_reference`.
"""
from __future__ import annotations

import os
import secrets
import sys
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
