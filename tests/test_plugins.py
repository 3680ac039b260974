"""Plugin discovery: a toy third-party arch plugin found through a fake dist-info."""
import sys
import textwrap

import pytest

from ck_core import PluginError, PluginManager
from ck_core.testing import arch_plugin, make_fake_arch

TOY_MODULE = '''
from ck_core import ArchSpec, hookimpl

@hookimpl
def ck_register_archs():
    return [ArchSpec(name="toy1", vendor="other", family="toy", warp_size=16,
                     lds_bytes=32768, compute_units=2, dtypes=("fp32", "fp16"),
                     warp_tiles={"fp16": ((16, 16, 16),), "fp32": ((16, 16, 4),)},
                     wave_layouts=((1, 1, 1),), pipelines=("mem",),
                     triton_target=("cuda", 80, 32))]
'''


def _install_toy(tmp_path, dist="toy-arch", module="ck_toy_arch", ep_name="toy1"):
    (tmp_path / f"{module}.py").write_text(TOY_MODULE)
    info = tmp_path / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[ck_core.archs]\n{ep_name} = {module}\n")
    return tmp_path


@pytest.fixture
def toy_path(tmp_path, monkeypatch):
    path = _install_toy(tmp_path)
    monkeypatch.syspath_prepend(str(path))
    yield path
    sys.modules.pop("ck_toy_arch", None)


def test_third_party_arch_is_discovered(toy_path):
    mgr = PluginManager()
    arch = mgr.arch("toy1")
    assert arch.distribution == "toy-arch"
    assert any(p["name"] == "toy1" and p["distribution"] == "toy-arch" for p in mgr.loaded)


def test_toy_arch_enumerates_gemm(toy_path):
    pytest.importorskip("ck_gemm")
    from ck_core import enumerate_keys

    keys = enumerate_keys("gemm", "toy1", manager=PluginManager())
    assert keys and all(k.arch == "toy1" for k in keys)
    assert {k.signature.dtype for k in keys} == {"fp16", "fp32"}


def test_block_list(toy_path, monkeypatch):
    monkeypatch.setenv("CK_BLOCK_PLUGINS", "toy1")
    assert "toy1" not in PluginManager().archs()


def test_allow_list(toy_path, monkeypatch):
    monkeypatch.setenv("CK_PLUGINS", "gemm")
    mgr = PluginManager()
    assert "toy1" not in mgr.archs()
    monkeypatch.setenv("CK_PLUGINS", "toy1")
    assert "toy1" in PluginManager().archs()


def test_disable_autoload_keeps_builtins(toy_path, monkeypatch):
    monkeypatch.setenv("CK_DISABLE_PLUGIN_AUTOLOAD", "1")
    mgr = PluginManager()
    assert "toy1" not in mgr.archs()
    assert "numpy" in mgr.backends()


def test_bad_knob_value_is_a_clear_error(monkeypatch):
    from ck_core.errors import ConfigError

    monkeypatch.setenv("CK_DISABLE_PLUGIN_AUTOLOAD", "maybe")
    with pytest.raises(ConfigError, match="CK_DISABLE_PLUGIN_AUTOLOAD"):
        PluginManager()


def test_duplicate_names_name_both_distributions(toy_path):
    dup = arch_plugin(make_fake_arch("toy1"))
    with pytest.raises(PluginError) as err:
        PluginManager(plugins=[dup])
    assert "toy-arch" in str(err.value) and "<explicit>" in str(err.value)


def test_wrong_record_type_names_the_plugin():
    import types

    from ck_core import hookimpl

    mod = types.ModuleType("badplugin")
    mod.ck_register_archs = hookimpl(lambda: [{"name": "x"}])
    with pytest.raises(PluginError, match="ArchSpec"):
        PluginManager(plugins=[mod], autoload=False)


def test_unknown_arch_message_says_how_to_fix():
    with pytest.raises(PluginError, match="pip install ck-arch-nope"):
        PluginManager().arch("nope")
