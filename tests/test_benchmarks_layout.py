"""benchmarks/ holds only maintained suites and tools (issue #30): each script is listed in
benchmarks/README.md, and no one-off tool lingers in tools/."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_benchmark_script_is_documented():
    doc = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    missing = [s for s in scripts if f"`{s}`" not in doc]
    assert not missing, f"benchmarks/README.md does not list {missing}: document them or delete them"


def test_the_readme_lists_no_missing_script():
    doc = (ROOT / "benchmarks" / "README.md").read_text()
    for line in doc.splitlines():
        if line.startswith("| `") and (line.split("`")[1].endswith((".py", ".sh"))):
            name = line.split("`")[1]
            assert (ROOT / "benchmarks" / name).is_file(), f"benchmarks/README.md lists {name}, which is gone"
