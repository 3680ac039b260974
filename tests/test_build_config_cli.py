import json
import subprocess
import sys
import types

import numpy as np
import pytest

from ck_core import BackendSpec, CompileError, ConfigError, PluginManager, Registry, hookimpl, plugins
from ck_core.cli import main
from ck_core.config import load_kernel_sets
from ck_core.testing import arch_plugin

pytest.importorskip("ck_gemm")


def _flaky_backend():
    mod = types.ModuleType("flaky_backend")

    def compile_(key, op, arch, opts):
        if key.algorithm.tile_m == 128:
            raise CompileError("simulated compiler crash")
        if key.algorithm.tile_n == 128 and key.algorithm.tile_m == 64:
            raise RuntimeError("segfault-ish")
        return {"shared": 1}

    mod.ck_register_backends = hookimpl(lambda: [BackendSpec(
        name="flaky", available=lambda: (True, ""), can_execute=lambda a: (True, ""),
        to_backend=np.asarray, to_numpy=np.asarray, compile=compile_)])
    return mod


def test_failing_kernels_are_reported_and_skipped(fake_arch, monkeypatch):
    mgr = PluginManager(plugins=[arch_plugin(fake_arch), _flaky_backend()])
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    reg = Registry.from_enumeration("gemm", fake_arch.name, "flaky", dtypes=["fp16"], layouts=["rcr"])
    n = len(reg)
    report = reg.build(max_workers=1, progress=False)
    assert report.failed and report.built
    assert len(report.built) + len(report.failed) == n
    assert len(reg) == len(report.built)
    assert all(k.algorithm.tile_m != 128 for k in reg)
    assert any("simulated compiler crash" in e for e in report.failed.values())
    assert any("segfault-ish" in e for e in report.failed.values())


def test_numpy_build_is_trivial(ck_manager, fake_arch):
    reg = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], layouts=["rcr"])
    report = reg.build()
    assert report.ok and len(report.built) == len(reg)


def test_kernel_sets_toml(tmp_path, ck_manager, fake_arch):
    f = tmp_path / "sets.toml"
    f.write_text(f'''
[[kernel_set]]
name = "small"
op = "gemm"
arch = "{fake_arch.name}"
filter = "c.tile_m == 64 and c.layout == 'rcr'"
[kernel_set.options]
dtypes = ["fp16"]
''')
    (ks,) = load_kernel_sets(f)
    reg = ks.registry()
    assert reg and all(k.algorithm.tile_m == 64 and k.signature.dtype == "fp16" for k in reg)


@pytest.mark.parametrize("body, match", [
    ("[[kernel_set]]\nop = 'gemm'\n", "missing key 'arch'"),
    ("[[kernel_set]]\nop = 'gemm'\narch = 'x'\ncolour = 1\n", "unknown key"),
    ("[[kernel_set]]\nop = 'gemm'\narch = 3\n", r"kernel_set\[0\]\.arch"),
    ("[[kernel_set]]\nop = 'gemm'\narch = 'x'\nfilter = 'c.__class__'\n", r"kernel_set\[0\]\.filter"),
    ("kernel_set = 3\n", "kernel_set"),
    ("[[kernel_set]\n", "not valid TOML"),
])
def test_kernel_set_errors_name_file_and_key(tmp_path, body, match):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ConfigError, match=match) as err:
        load_kernel_sets(f)
    assert "bad.toml" in str(err.value)


def test_cli_list_count_json(ck_manager, fake_arch, capsys):
    assert main(["list", "gemm", "--arch", fake_arch.name, "--count", "--dtypes", "fp16"]) == 0
    n = int(capsys.readouterr().out)
    assert n > 0
    assert main(["list", "gemm", "--arch", fake_arch.name, "--filter", "c.tile_m == 64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kernels"] and all(k["algorithm"]["tile_m"] == 64 for k in data["kernels"])


def test_cli_run_gemm_validates(ck_manager, fake_arch, capsys):
    rc = main(["run", "gemm", "--arch", fake_arch.name, "--m", "67", "--n", "45", "--k", "33",
               "--dtype", "bf16", "--layout", "crr", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["passed"] and out["plan"][0]["kernel"].startswith("gemm_bf16_crr")


def test_cli_errors_are_clean(ck_manager, fake_arch, capsys):
    assert main(["run", "gemm", "--arch", fake_arch.name, "--m", "-4", "--n", "4", "--k", "4"]) == 2
    assert "positive" in capsys.readouterr().err
    assert main(["list", "gemm", "--arch", "nope", "--count"]) == 2
    assert main(["list", "gemm", "--arch", fake_arch.name, "--filter", "__import__('os')"]) == 2
    assert "not allowed" in capsys.readouterr().err


def test_cli_export_import(ck_manager, fake_arch, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["export", "gemm", "--arch", fake_arch.name, "--dtypes", "fp16", "-o", str(out)]) == 0
    assert main(["import", str(out)]) == 0
    assert "gemm:" in capsys.readouterr().out


def test_python_dash_m_entry():
    r = subprocess.run([sys.executable, "-m", "ck_core", "knobs"], capture_output=True, text=True)
    assert r.returncode == 0 and "CK_CACHE_DIR" in r.stdout
