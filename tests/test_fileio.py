"""Every file the project reads goes through ck_core.fileio: special files never hang or exhaust
memory, oversized and non-UTF-8 files are refused by name, with a CkError that says what to do.

Each reader (registry import, kernel-set config, filter file, tuning table, tuned-data store,
oracle, sweep config / matrix) is fed a FIFO, /dev/zero (through a symlink too), a directory,
an oversized file and bad UTF-8; each case runs under a watchdog so a hang fails the test
instead of stalling the suite.
"""
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from ck_core import CkError, fileio

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")


@pytest.fixture(autouse=True)
def _watchdog():
    """Fail (not hang) when a read blocks: SIGALRM interrupts the blocked open/read."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def boom(*_):
        raise TimeoutError("a read blocked")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


def _dev_zero(p: Path) -> Path:
    p.symlink_to("/dev/zero")
    return p


def _dir(p: Path) -> Path:
    p.mkdir()
    return p


def _bad_utf8(p: Path) -> Path:
    p.write_bytes(b'{"a": "\xff\xfe"}\n')
    return p


def _nul(p: Path) -> Path:
    p.write_bytes(b'{"a": 1}\x00\n')
    return p


SPECIAL = [("fifo", _fifo, "FIFO"), ("dev_zero_link", _dev_zero, "character device"),
           ("directory", _dir, "directory"), ("bad_utf8", _bad_utf8, "UTF-8"), ("nul", _nul, "NUL"),
           ("missing", lambda p: p, "No such file")]


@pytest.mark.parametrize("name,make,says", SPECIAL, ids=[s[0] for s in SPECIAL])
def test_read_text_refuses_what_is_not_a_small_text_file(tmp_path, name, make, says):
    p = make(tmp_path / "f.json")
    with pytest.raises(CkError) as err:
        fileio.read_text(p, "test file")
    assert str(p) in str(err.value) and says in str(err.value)


def test_dev_zero_directly_and_the_size_limit(tmp_path):
    with pytest.raises(CkError, match="character device"):
        fileio.read_bytes("/dev/zero", "test file", limit=1 << 30)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2000)
    with pytest.raises(CkError, match="more than the 1000 bytes"):
        fileio.read_bytes(big, "test file", limit=1000)
    assert fileio.read_bytes(big, "test file", limit=2000) == b" " * 2000


def test_a_link_to_a_regular_file_is_read(tmp_path):
    (tmp_path / "real.json").write_text('{"a": [1, 2]}')
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert fileio.read_json(tmp_path / "link.json") == {"a": [1, 2]}


def test_json_nesting_is_bounded(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 200000 + "]" * 200000)
    with pytest.raises(CkError, match="too deeply"):
        fileio.read_json(p, "test file", limit=1 << 20)
    p.write_text("[" * 70 + "]" * 70)
    with pytest.raises(CkError, match="deeper than 64"):
        fileio.read_json(p)
    p.write_text('{"x": NaN}')
    assert fileio.read_json(p)["x"] != fileio.read_json(p)["x"]
    with pytest.raises(CkError, match="finite"):
        fileio.read_json(p, allow_nan=False)


# -- every reader of the project goes through it ------------------------------------------------

def _registry(p):
    from ck_core.registry import Registry
    Registry.import_json(p)


def _kernel_sets(p):
    from ck_core.config import load_kernel_sets
    load_kernel_sets(p)


def _config_json(p):
    from ck_core.config import load_json
    load_json(p)


def _filter_file(p):
    from ck_core.filters import load_filter_file
    load_filter_file(p)


def _tuned_data(p):
    from ck_core import tuned_data
    try:
        tuned_data.tables("toy", p.stem, shipped=p.parent)   # the reader of the shipped files and the store
    finally:
        tuned_data.clear_cache()


def _oracle(p):
    from ck_core.select_data import load
    load(p)


def _matrix(p):
    from ck_core.sweep.matrix import load_matrix
    load_matrix(p, "smoke")


def _sweep_config(p):
    from ck_core.sweep.kernels import load_config
    load_config(p)


def _preset(p):
    from ck_core.presets import load
    load(str(p))


READERS = [("preset", _preset, ".json"), ("registry", _registry, ".json"), ("kernel_sets", _kernel_sets, ".toml"),
           ("config_json", _config_json, ".json"), ("filter_file", _filter_file, ".txt"),
           ("tuned_data", _tuned_data, ".json"), ("oracle", _oracle, ".jsonl"),
           ("matrix", _matrix, ".toml"), ("sweep_config", _sweep_config, ".json")]


@pytest.mark.parametrize("reader,read,ext", READERS, ids=[r[0] for r in READERS])
@pytest.mark.parametrize("name,make,says", SPECIAL[:5], ids=[s[0] for s in SPECIAL[:5]])
def test_every_reader_refuses_special_and_binary_files(tmp_path, reader, read, ext, name, make, says):
    p = make(tmp_path / f"f{ext}")
    with pytest.raises(CkError) as err:
        read(p)
    assert str(p) in str(err.value) and says in str(err.value)


def test_the_retired_tuning_db_knob_pointing_at_a_fifo(tmp_path, monkeypatch, caplog):
    from ck_core import tuned_data
    from ck_core.winners import Winners

    monkeypatch.setenv("CK_TUNING_DB", str(_fifo(tmp_path / "t.json")))
    tuned_data.clear_cache()
    try:
        with caplog.at_level("WARNING", logger="ck_core.winners"):
            Winners()   # the FIFO is named in a warning, never opened (it would block)
        assert tuned_data.user_dir() == tmp_path / "t.d"
    finally:
        tuned_data.clear_cache()


def test_the_tuned_data_store_refuses_special_files(tmp_path, monkeypatch):
    from ck_core import tuned_data

    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "t.json"))
    tuned_data.clear_cache()
    (tmp_path / "t.d" / "gemm").mkdir(parents=True)
    _fifo(tmp_path / "t.d" / "gemm" / "sm90.json")
    try:
        with pytest.raises(CkError, match="FIFO"):
            tuned_data.tables("gemm", "sm90", shipped=tmp_path / "none")
    finally:
        tuned_data.clear_cache()


def test_oversized_files_are_refused_before_they_are_read(tmp_path):
    from ck_core.config import load_json

    p = tmp_path / "big.json"
    with open(p, "wb") as f:   # sparse: costs no disk
        f.truncate(fileio.LIMITS["tuned"] + 1)
    with pytest.raises(CkError, match="MiB"):
        _tuned_data(p)
    with pytest.raises(CkError, match="MiB"):
        load_json(p)


def test_ck_import_of_a_fifo_exits_with_an_error(tmp_path, capsys):
    from ck_core.cli import main

    p = _fifo(tmp_path / "f.json")
    assert main(["import", str(p)]) == 2
    assert "FIFO" in capsys.readouterr().err


@pytest.mark.parametrize("lines,says", [
    (['{"op": ["gemm"], "arch": "sm90"}'], "not names"),
    (['{"op": "gemm", "arch": "sm90"}', '{"kernel": [1], "name": "x"}'], "not an integer"),
    (['{"op": "gemm", "arch": "sm90"}', '{"times": [[0, 1.0]], "problem": {}}'], "names no kernel"),
    (['{"op": "gemm", "arch": "sm90"}', '{"kernel": 0, "name": "nope"}', '{"times": [[0, 1.0]], "problem": {}}'],
     "malformed row"),
    (['{"op": "gemm", "arch": "sm90"}', '{"times": 5}'], "malformed row"),
    (["[1]"], "not an object"), (["{"], "not JSON"),
], ids=["op-list", "kernel-list", "unknown-index", "bad-name", "times-int", "list", "broken"])
def test_oracle_rows_are_checked(tmp_path, lines, says):
    from ck_core.select_data import load

    p = tmp_path / "o.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(CkError, match=says):
        load(p)


def test_a_gzip_oracle_that_is_not_gzip(tmp_path):
    from ck_core.select_data import load

    p = tmp_path / "o.jsonl.gz"
    p.write_bytes(b"not gzip at all")
    with pytest.raises(CkError, match="not gzip"):
        load(p)


#: files of ck_core that may read without fileio, and why: the built-artifact cache (its own
#: hardening: hashed paths, atomic writes, damaged entries rebuilt), /proc, the package's own data
RAW_READS_ALLOWED = {
    "cache.py": "the artifact cache's own records",
    "backends/triton_artifacts.py": "artifact blobs from the cache",
    "backends/ck_backend.py": "generated sources in the cache",
    "kernel_wheel.py": "the cache's kernels packed into a wheel",
    "memory.py": "/proc/meminfo",
    "fileio.py": "the reader itself",
}


def test_the_core_reads_user_files_only_through_fileio():
    import ast

    root = Path(__file__).resolve().parents[1] / "ck_core"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in RAW_READS_ALLOWED:
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            bad = False
            if isinstance(f, ast.Name) and f.id == "open":
                mode = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "r"
                bad = not any(c in str(mode) for c in "wax")
            elif isinstance(f, ast.Attribute) and f.attr in ("read_text", "read_bytes"):
                bad = not (isinstance(f.value, ast.Name) and f.value.id == "fileio")
            elif isinstance(f, ast.Attribute) and f.attr == "load":
                bad = isinstance(f.value, ast.Name) and f.value.id in ("json", "tomllib", "pickle", "np")
            if bad:
                offenders.append(f"{rel}:{node.lineno}: {(ast.get_source_segment(text, node) or '')[:80]}")
    assert not offenders, "read these through ck_core.fileio:\n" + "\n".join(offenders)
