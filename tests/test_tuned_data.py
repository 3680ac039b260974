"""ck_core.tuned_data: per-(op, arch) data files with provenance, shipped + user overlay, cached, validated;
ck_core.winners: ck tune's winners in that store, read by the Dispatcher."""
import json
import math
from pathlib import Path

import pytest

from ck_core import tuned_data
from ck_core.errors import ConfigError
from ck_core.winners import Winners

PROV = {"command": "probe.py --x", "date": "2026-11-22", "device": "H100 SXM", "source": "notes"}


def _doc(op="toy", arch="a1", tables=None, prov=PROV):
    return {"format": tuned_data.FORMAT, "op": op, "arch": arch, "provenance": prov,
            "tables": tables if tables is not None else
            {"tiles": {"key": ["d", "causal"], "entries": [{"key": [64, False], "value": {"bm": 64}},
                                                           {"key": [128, True], "value": {"bm": 128}}]}}}


@pytest.fixture
def store(tmp_path, monkeypatch):
    """(shipped folder, user folder of op 'toy'); the user store under tmp_path, never the real cache."""
    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "tuning.json"))
    tuned_data.clear_cache()
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "a1.json").write_text(json.dumps(_doc()))
    yield shipped, tmp_path / "tuning.d" / "toy"
    tuned_data.clear_cache()


def test_read_with_provenance(store):
    shipped, _ = store
    t = tuned_data.table("toy", "a1", "tiles", shipped)
    assert len(t) == 2 and t[(64, False)] == {"bm": 64} and t.get([128, True]) == {"bm": 128}
    assert t.fields == ("d", "causal") and dict(t.provenance) == PROV
    assert tuned_data.table("toy", "a1", "nope", shipped) is tuned_data.EMPTY
    assert len(tuned_data.table("toy", "other_arch", "tiles", shipped)) == 0
    with pytest.raises(TypeError):
        t.entries[(1, 2)] = 3   # read-only


def test_user_overlay_overrides_and_adds(store):
    shipped, user = store
    path = tuned_data.write("toy", "a1", "tiles", [((64, False), {"bm": 32}), ((256, False), {"bm": 16})],
                            command="ck tune", device="dev", source="test")
    assert path == user / "a1.json"
    t = tuned_data.table("toy", "a1", "tiles", shipped)
    assert t[(64, False)] == {"bm": 32} and t[(256, False)] == {"bm": 16} and t[(128, True)] == {"bm": 128}
    assert t.provenance_of((64, False))["command"] == "ck tune"
    assert t.provenance_of((128, True))["command"] == PROV["command"]
    # a second write keeps the first one's other entries
    tuned_data.write("toy", "a1", "tiles", [((64, False), {"bm": 8})], command="c", device="d", source="s")
    t = tuned_data.table("toy", "a1", "tiles", shipped)
    assert t[(64, False)] == {"bm": 8} and t[(256, False)] == {"bm": 16}


def _garbage():
    no_prov = _doc()
    del no_prov["provenance"]
    return [
        "{",                                                                   # not JSON
        json.dumps({"format": "other/9", "tables": {}}),                      # wrong format
        json.dumps(_doc(arch="a2")),                                          # another arch's file
        json.dumps(no_prov),                                                  # no provenance
        json.dumps(_doc(prov={**PROV, "device": ""})),                       # empty provenance field
        json.dumps(_doc(tables={"tiles": {"entries": "x"}})),                 # entries not a list
        json.dumps(_doc(tables={"tiles": {"entries": [{"key": 1, "value": 2}]}})),  # key not a list
        json.dumps(_doc(tables={"tiles": {"key": ["a", "b"], "entries": [{"key": [1], "value": 2}]}})),
        json.dumps(_doc(tables={"tiles": {"entries": [{"key": [{"a": 1}], "value": 2}]}})),
    ]


@pytest.mark.parametrize("text", _garbage())
def test_garbage_is_a_config_error_naming_the_file(store, text):
    shipped, user = store
    user.mkdir(parents=True)
    (user / "a1.json").write_text(text)
    with pytest.raises(ConfigError, match=str(user / "a1.json")):
        tuned_data.table("toy", "a1", "tiles", shipped)
    with pytest.raises(ConfigError):   # and nothing is written on top of a broken file
        tuned_data.write("toy", "a1", "tiles", [((1, 2), 3)], command="c", device="d", source="s")


def test_warm_lookup_reads_no_file(store, monkeypatch):
    shipped, _ = store
    tuned_data.table("toy", "a1", "tiles", shipped)

    def no_io(*a, **k):
        raise AssertionError("a warm lookup touched the file system")

    for name in ("read_text", "is_file", "exists", "stat"):
        monkeypatch.setattr(Path, name, no_io)
    monkeypatch.setattr("builtins.open", no_io)
    assert tuned_data.table("toy", "a1", "tiles", shipped)[(64, False)] == {"bm": 64}


def test_shipped_folder_comes_from_the_opspec(store, ck_manager, monkeypatch):
    import attrs

    shipped, _ = store
    spec = attrs.evolve(ck_manager.op("gemm"), tuning_data=str(shipped))
    monkeypatch.setitem(ck_manager._ops, "gemm", spec)
    (shipped / "a1.json").write_text(json.dumps(_doc(op="gemm")))
    tuned_data.clear_cache()
    assert tuned_data.table("gemm", "a1", "tiles")[(128, True)] == {"bm": 128}


def test_core_names_no_plugin():
    for mod in ("tuned_data.py", "winners.py"):
        text = (Path(tuned_data.__file__).parent / mod).read_text()
        assert not any(p in text for p in ("ck_gemm", "ck_fmha", "ck_conv"))


def test_tune_writes_the_store_and_the_dispatcher_reads_it(store, reg_and_problem):
    from ck_core.dispatcher import Dispatcher
    from ck_core.tuning import tune

    reg, p, inputs = reg_and_problem
    first = Dispatcher(reg).select(p).name
    fake = iter(range(1000, 0, -1))   # later candidates look faster
    w = Winners(command="ck tune gemm", device="cpu")
    results = tune(Dispatcher(reg), p, inputs, timer=lambda fn: (fn(), next(fake))[1], table=w, top=4)
    assert results[0][0] != first and math.isfinite(results[0][1])
    path = w.save()
    doc = json.loads(path.read_text())
    assert doc["op"] == "gemm" and doc["tables"]["kernels"]["provenance"]["command"] == "ck tune gemm"
    assert Dispatcher(reg, tuning=Winners()).select(p).name == results[0][0]


@pytest.fixture
def reg_and_problem(ck_manager, fake_arch, ck_rng):
    pytest.importorskip("ck_gemm")
    from ck_core.registry import Registry
    from ck_gemm.problem import GemmProblem
    from ck_gemm.reference import make_inputs

    reg = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"], manager=ck_manager)
    p = GemmProblem(m=100, n=60, k=64)
    return reg, p, make_inputs(p, ck_rng)


@pytest.mark.parametrize("op,arch", [("toy", "../x"), ("../toy", "a1"), ("toy", ".hidden"), ("toy", "a/b")])
def test_names_cannot_leave_the_store(store, op, arch):
    with pytest.raises(ConfigError, match="cannot name a data file"):
        tuned_data.write(op, arch, "t", [((1,), 2)], command="c", device="d", source="s")
    with pytest.raises(ConfigError, match="cannot name a data file"):
        tuned_data.table(op, arch, "t")


def test_a_value_that_is_not_json_is_a_config_error(store):
    with pytest.raises(ConfigError, match="not JSON"):
        tuned_data.write("toy", "a1", "t", [((1,), object())], command="c", device="d", source="s")
    assert not (store[1] / "a1.json").exists()
