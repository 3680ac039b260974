"""The single-file tuning table (``tuning.json``) is retired: the Dispatcher's tuning source is the
tuned-data store only (``CK_TUNED_DIR``), ``ck tune`` always writes the store, ``--db`` is a usage
error naming the replacement, and a ``tuning.json`` at the old place is named once in a warning,
never read."""
import json
import logging

import pytest

from ck_core import knobs, tuned_data, winners
from ck_core.cli import main
from ck_core.winners import Winners


class _P:
    op = "toy"

    def bucket(self):
        return (3, "x")

    def to_dict(self):
        return {"m": 3}


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A private cache folder, no store knobs, no warning given yet."""
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CK_TUNING_DB", raising=False)
    monkeypatch.delenv("CK_TUNED_DIR", raising=False)
    monkeypatch.setattr(winners, "_WARNED", set())
    tuned_data.clear_cache()
    yield tmp_path
    tuned_data.clear_cache()


def test_the_store_folder_knobs(fresh, monkeypatch):
    assert tuned_data.user_dir() == fresh / "cache" / "tuning.d"
    monkeypatch.setenv("CK_TUNING_DB", str(fresh / "old" / "mine.json"))   # the older knob: NAME.d beside it
    assert tuned_data.user_dir() == fresh / "old" / "mine.d"
    monkeypatch.setenv("CK_TUNED_DIR", str(fresh / "store"))               # the new one wins
    assert tuned_data.user_dir() == fresh / "store"
    assert "CK_TUNED_DIR" in knobs.KNOBS and "retired" in knobs.KNOBS["CK_TUNING_DB"].doc


def test_a_tuning_json_at_the_old_place_is_not_read_and_named_once(fresh, caplog):
    old = fresh / "cache" / "tuning.json"
    old.parent.mkdir(parents=True)
    key = f"a1|numpy|toy|{_P().bucket()}"
    old.write_text(json.dumps({"format": "ck-dispatcher.tuning/1",
                               "entries": {key: {"kernel": "old_winner", "seconds": 1e-6}}}))
    with caplog.at_level(logging.WARNING, logger="ck_core.winners"):
        assert Winners().lookup("a1", "numpy", _P()) is None
        assert Winners().lookup("a1", "numpy", _P()) is None
    (rec,) = [r for r in caplog.records if r.name == "ck_core.winners"]
    msg = rec.getMessage()
    assert str(old) in msg and "retired" in msg and "ck tune" in msg and str(fresh / "cache" / "tuning.d") in msg


def test_a_garbage_tuning_json_is_not_read_either(fresh, monkeypatch, caplog):
    old = fresh / "t.json"
    old.write_bytes(b"\x00\xff[" * 1000)
    monkeypatch.setenv("CK_TUNING_DB", str(old))
    with caplog.at_level(logging.WARNING, logger="ck_core.winners"):
        w = Winners()
        w.record("a1", "numpy", _P(), "new_winner", 2e-6)
        assert w.save() == fresh / "t.d" / "toy" / "a1.json"
    tuned_data.clear_cache()
    assert Winners().lookup("a1", "numpy", _P()) == "new_winner"
    assert sum(str(old) in r.getMessage() for r in caplog.records) == 1


def test_no_warning_without_a_retired_file(fresh, caplog):
    with caplog.at_level(logging.WARNING, logger="ck_core.winners"):
        Winners()
    assert not [r for r in caplog.records if r.name == "ck_core.winners"]


def test_ck_tune_db_is_a_usage_error_naming_the_replacement(fresh, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["tune", "gemm", "--m", "8", "--n", "8", "--k", "8", "--db", str(fresh / "t.json")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--db is retired" in err and "CK_TUNED_DIR" in err
    assert not (fresh / "t.json").exists() and not (fresh / "cache" / "tuning.d").exists()


def test_ck_tune_help_says_where_winners_go(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--db PATH" in out and "retired" in out and "CK_TUNED_DIR" in out


def test_a_blocked_cache_folder_does_not_stop_a_store_elsewhere(fresh, monkeypatch):
    (fresh / "blocker").write_text("a file, not a folder")
    monkeypatch.setenv("CK_CACHE_DIR", str(fresh / "blocker" / "cache"))
    monkeypatch.setenv("CK_TUNED_DIR", str(fresh / "store"))
    w = Winners()
    w.record("a1", "numpy", _P(), "k", 1e-6)
    assert w.save() == fresh / "store" / "toy" / "a1.json"
