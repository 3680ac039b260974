"""ck_core.testing.check_op_plugin: the op-plugin test kit passes on the example op of
docs/writing-an-op-plugin.md and on the three real op plugins, and catches a broken plugin."""
from __future__ import annotations

import sys
from pathlib import Path

import attrs
import pytest

from ck_core.plugins import PluginManager
from ck_core.testing import check_op_plugin

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin_op"


@pytest.fixture(scope="module")
def rmsnorm_plugin():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from ck_rmsnorm import plugin
        yield plugin
    finally:
        sys.path.remove(str(EXAMPLE))


def test_the_example_op_passes_the_kit(rmsnorm_plugin):
    from ck_rmsnorm import RmsNormProblem

    report = check_op_plugin("rmsnorm", plugin=rmsnorm_plugin,
                             problems=[RmsNormProblem(rows=7, cols=333, dtype="bf16")])
    assert report["keys"] > 10


def test_the_example_op_on_the_fake_arch(rmsnorm_plugin, monkeypatch):
    """Without the AMD arch plugins the kit enumerates on its fake arch."""
    monkeypatch.setenv("CK_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert check_op_plugin("rmsnorm", plugin=rmsnorm_plugin)["arch"] == "fake64"


@pytest.mark.parametrize("op", ["gemm", "conv", "fmha"])
def test_the_real_op_plugins_pass_the_kit(op):
    problems = None   # gemm, fmha: their ck demo cases
    if op == "conv":
        from ck_conv import ConvProblem

        problems = [ConvProblem(N=2, G=2, C=8, K=12, input_spatial=(9, 11), filter=(3, 3), direction=d)
                    for d in ("forward", "bwd_data", "bwd_weight")]
    report = check_op_plugin(op, problems=problems)   # on gfx942
    assert report["keys"] > 100 and report["problems"] >= 1


def test_the_example_op_through_the_cli(rmsnorm_plugin, monkeypatch, capsys):
    """The core names no plugin: a newly installed op gets ck list / run / --help / demo for free."""
    from ck_core import plugins
    from ck_core.cli import main

    monkeypatch.setattr(plugins, "_MANAGER", PluginManager(plugins=[rmsnorm_plugin]))
    assert main(["run", "rmsnorm", "--arch", "gfx942", "--rows", "37", "--cols", "1000", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "verdict : PASS y:" in out and "rmsnorm_bf16_" in out, out
    with pytest.raises(SystemExit):
        main(["run", "rmsnorm", "--help"])
    assert "added to the mean of squares" in capsys.readouterr().out
    assert main(["demo"]) == 0 and "[rmsnorm]" in capsys.readouterr().out


def test_the_kit_catches_a_field_without_help(rmsnorm_plugin):
    import types
    from typing import ClassVar

    from ck_core.hookspecs import hookimpl
    from ck_core.problem import Problem

    @attrs.frozen
    class Bare(Problem):
        op: ClassVar[str] = "rmsnorm"
        rows: int = attrs.field(metadata={"help": "rows"})
        cols: int = attrs.field()

    mod = types.ModuleType("ck_test_bare_rmsnorm")
    mod.ck_register_ops = hookimpl(lambda: [attrs.evolve(rmsnorm_plugin.rmsnorm_op(), problem_type=Bare)])
    with pytest.raises(AssertionError, match="cols"):
        check_op_plugin("rmsnorm", plugin=mod)


def test_the_kit_catches_a_wrong_kernel(rmsnorm_plugin, monkeypatch):
    from ck_rmsnorm.backends import numpy_impl

    real = numpy_impl.launcher

    def off_by_eps(key):
        run = real(key)
        return lambda p, t: {"y": run(p, t)["y"] * 1.1}

    monkeypatch.setattr(numpy_impl, "launcher", off_by_eps)
    with pytest.raises(AssertionError, match="FAIL"):
        check_op_plugin("rmsnorm", plugin=rmsnorm_plugin)
