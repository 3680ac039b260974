"""The documentation's code runs as written: the README's Python snippet, docs/plugins.md's arch plugin."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def code_blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_python_snippet_runs(capsys):
    (snippet,) = code_blocks(ROOT / "README.md", "python")
    exec(compile(snippet, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "PASS c:" in out and ".gfx942.numpy" in out, out


def test_plugins_md_example_arch_passes_the_arch_checks():
    from ck_core.testing import check_arch_plugin

    blocks = code_blocks(ROOT / "docs" / "plugins.md", "python")
    plugin_src = next(b for b in blocks if "ck_register_archs" in b and "def " in b)
    mod = types.ModuleType("ck_arch_mygpu.plugin")
    exec(compile(plugin_src, "docs/plugins.md", "exec"), mod.__dict__)
    spec = mod.ck_register_archs()[0]
    try:
        keys = check_arch_plugin(spec, plugin=mod, name="mygpu", vendor="nvidia", target=("cuda", 80, 32),
                                 warp_size=32, lds_bytes=166912)
    except pytest.skip.Exception as exc:
        # only the pip entry point cannot be checked for a plugin that is not installed
        unchecked = str(exc).split("not checked: ", 1)[1]
        assert unchecked.startswith("entry point") and ";" not in unchecked, unchecked
    else:
        assert keys
    # the test the docs tell the reader to write names the same facts
    test_src = next(b for b in blocks if "check_arch_plugin(" in b)
    assert 'name="mygpu"' in test_src and "166912" in test_src


def test_plugins_md_toml_names_the_entry_point_group():
    (toml,) = code_blocks(ROOT / "docs" / "plugins.md", "toml")
    if sys.version_info >= (3, 11):
        import tomllib

        data = tomllib.loads(toml)
        assert data["project"]["entry-points"]["ck_core.archs"]["mygpu"] == "ck_arch_mygpu.plugin"
    else:
        assert '[project.entry-points."ck_core.archs"]' in toml


def test_every_plugin_has_a_readme_named_for_its_package():
    """Each op and arch plugin (a folder with a pyproject.toml under plugins/ or archs/) documents itself:
    a README.md whose title is the distribution's name."""
    folders = sorted(p.parent for pattern in ("plugins/*/pyproject.toml", "archs/*/pyproject.toml")
                     for p in ROOT.glob(pattern))
    assert len(folders) >= 9, folders
    for folder in folders:
        name = re.search(r'^name\s*=\s*"([^"]+)"', (folder / "pyproject.toml").read_text(), re.M).group(1)
        readme = folder / "README.md"
        assert readme.is_file(), f"{folder.relative_to(ROOT)} has no README.md"
        title = readme.read_text().splitlines()[0]
        assert title.startswith("# ") and name in title, (folder.name, title)
