"""benchmarks/ holds only maintained suites and tools (issue #30): each script is listed in
benchmarks/README.md, no one-off tool lingers in tools/, and every results JSON says what wrote it."""
from __future__ import annotations

import glob
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_benchmark_script_is_documented():
    doc = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    missing = [s for s in scripts if f"`{s}`" not in doc]
    assert not missing, f"benchmarks/README.md does not list {missing}: document them or delete them"


def test_no_tool_lingers_in_tools():
    left = sorted(p.name for p in (ROOT / "tools").glob("*")) if (ROOT / "tools").is_dir() else []
    assert not left, f"tools/ holds {left}: a maintained tool lives in benchmarks/ (listed in its README), else delete it"


def test_the_readme_lists_no_missing_script():
    doc = (ROOT / "benchmarks" / "README.md").read_text()
    for line in doc.splitlines():
        if line.startswith("| `") and (line.split("`")[1].endswith((".py", ".sh"))):
            name = line.split("`")[1]
            assert (ROOT / "benchmarks" / name).is_file(), f"benchmarks/README.md lists {name}, which is gone"


def _script_is_here(command: str) -> bool:
    """Whether a results header's command runs something still in the tree: the ck CLI, a plugin
    module (``-m ck_<op>...``), or a script in benchmarks/, tests/ or a plugin package."""
    if re.search(r"(^|\s)ck (bench|build|sweep|tune|select)\b", command) or re.search(r"(^|\s)-m ck_\w+", command):
        return True
    for script in re.findall(r"[\w./-]+\.(?:py|sh)\b", command):
        base = Path(script).name
        if (ROOT / "benchmarks" / base).is_file() or (ROOT / "tests" / base).is_file() \
                or glob.glob(str(ROOT / "plugins" / "*" / "ck_*" / "**" / base), recursive=True):
            return True
    return False


def test_every_result_says_what_wrote_it():
    """A results JSON whose script is gone (or whose command was not recorded) is listed in
    benchmarks/README.md with what wrote it and who cites it, or lives in a folder whose README.md
    says so: no result file lingers that nothing here writes or explains."""
    results = ROOT / "benchmarks" / "results"
    doc = (ROOT / "benchmarks" / "README.md").read_text()
    listed = {line.split("`")[1] for line in doc.splitlines() if line.startswith("| `")}
    listed = {name for name in listed if name.endswith(".json")}
    orphans = []
    for path in sorted(results.rglob("*.json")):
        rel = path.relative_to(results).as_posix()
        data = json.loads(path.read_text())
        command = data.get("command", "") if isinstance(data, dict) else ""
        if _script_is_here(command) or rel in listed or (path.parent != results and (path.parent / "README.md").is_file()):
            continue
        orphans.append(f"{rel} ({command[:60]!r})")
    assert not orphans, (f"results that name no script here and that benchmarks/README.md does not list: {orphans}: "
                         f"list them there (what wrote them, who cites them) or delete them")
    gone = sorted(rel for rel in listed if not (results / rel).is_file())
    assert not gone, f"benchmarks/README.md lists results that are gone: {gone}"
