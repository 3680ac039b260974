import os
import sys
from pathlib import Path

import pytest

# Triton kernels run on the CPU through the interpreter in these tests
if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the ck_core.testing fixtures (ck_rng, fake_arch) come from the repository's root
# conftest; a standalone run of this folder loads them through -p ck_core.testing


@pytest.fixture
def conv_manager(monkeypatch):
    """A plugin manager holding the conv plugin and the test kit's fake arch (no autoload)."""
    from ck_core import plugins
    from ck_core.testing import arch_plugin, make_fake_arch

    import ck_conv.plugin

    mgr = plugins.PluginManager(plugins=[ck_conv.plugin, arch_plugin(make_fake_arch())], autoload=False)
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    return mgr


def pytest_configure(config):
    # Triton's CPU interpreter trips numpy's scalar-conversion deprecation on every index
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.runtime.interpreter")
