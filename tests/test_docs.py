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


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:   # Python 3.10
        import tomli as tomllib
    return tomllib.loads(path.read_text())


def test_readme_counts_the_examples_there_are():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"(\d+) GEMM, (\d+) convolution and (\d+) FMHA scripts", text)
    assert m, "README no longer counts the examples"
    have = [len(list((ROOT / "examples" / d).glob("[0-9][0-9]_*.py"))) for d in ("gemm", "conv", "fmha")]
    assert [int(g) for g in m.groups()] == have


def test_readme_keeps_two_commands_for_a_fresh_machine():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```", text, flags=re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[0].startswith("bash run.sh") and "pytest" in lines[1], lines


def test_readme_commands_are_not_piped_into_ck():
    """`ck cache info | ck cache clear` read as 'show the cache' but cleared it."""
    for block in code_blocks(ROOT / "README.md", "bash"):
        for line in block.splitlines():
            assert not re.search(r"\|\s*ck\b", line.split("  #")[0]), line


def test_readme_python_versions_are_run_sh_s():
    text = (ROOT / "README.md").read_text()
    run_sh = (ROOT / "run.sh").read_text()
    assert "Python 3.10 to 3.13" in text and "MIN=3.10 MAX=3.13" in run_sh
    assert "(3, 10) <= v <= (3, 13)" in run_sh
    for p in [ROOT / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml"), *ROOT.glob("archs/*/pyproject.toml")]:
        assert _toml(p)["project"]["requires-python"] == ">=3.10", p


def test_license_is_the_mit_text_the_metadata_names():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 ck-dispatcher authors" in text
    assert "WITHOUT WARRANTY OF ANY KIND" in text
    assert _toml(ROOT / "pyproject.toml")["project"]["license"] == {"text": "MIT"}


def test_console_scripts_ck_and_the_safe_name_ckd():
    scripts = _toml(ROOT / "pyproject.toml")["project"]["scripts"]
    assert scripts["ck"] == scripts["ckd"] == "ck_core.cli:main"
    assert "`ckd`" in (ROOT / "README.md").read_text()


def test_exit_codes_are_documented_as_they_are():
    from ck_core.errors import EXIT_CODES

    text = " ".join((ROOT / "README.md").read_text().split())
    for code in EXIT_CODES:
        assert re.search(rf"\b{code} [a-z]", text), f"README does not document exit code {code}"


def test_one_scheme_of_extras():
    """Every op plugin offers [torch] and [triton] through ck-core's; no exact pin where a range works."""
    from ck_core.deps import EXTRAS

    core = _toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]
    assert {"torch", "triton", "ray", "plot", "train"} <= set(core)
    assert set(EXTRAS.values()) <= set(core) | {"transformers"}
    for p in ROOT.glob("plugins/*/pyproject.toml"):
        extras = _toml(p)["project"].get("optional-dependencies", {})
        assert extras.get("torch") == ["ck-core[torch]"] and extras.get("triton") == ["ck-core[triton]"], p
        for name, reqs in extras.items():
            assert name in core or name == "transformers", (p, name)
    for p in [ROOT / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml")]:
        for name, reqs in _toml(p)["project"].get("optional-dependencies", {}).items():
            assert not [r for r in reqs if "==" in r], (p, name, reqs)


def test_op_plugin_guide_quotes_the_example_as_it_is():
    """docs/writing-an-op-plugin.md's code is the example plugin's code (no drift): every line of
    its Python blocks but the excerpts (those with "...") is a line of examples/plugin_op."""
    guide = ROOT / "docs" / "writing-an-op-plugin.md"
    source = "\n".join(p.read_text() for p in (ROOT / "examples" / "plugin_op").rglob("*.py"))
    lines = {ln.split("  #")[0].strip() for ln in source.splitlines()}
    blocks = [b for b in code_blocks(guide, "python") if "..." not in b]   # whole quotes, not excerpts
    assert len(blocks) >= 4
    for block in blocks:
        for ln in block.splitlines():
            if ln.strip() and "..." not in ln:
                assert ln.strip() in lines, f"the guide quotes a line the example does not have: {ln.strip()!r}"
    toml = code_blocks(guide, "toml")[0]
    assert toml.strip() in (ROOT / "examples" / "plugin_op" / "pyproject.toml").read_text()
    # the commands name the example's op and fields
    cmds = "\n".join(code_blocks(guide, "bash"))
    assert "ck run rmsnorm --arch gfx942 --rows 37 --cols 1000" in cmds
