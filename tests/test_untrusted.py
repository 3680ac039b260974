"""Untrusted files: registry JSON, cache entries, tuning tables, filters, generated code.

Each test plays the attacker (or the bit rot): a record whose fields hold paths or
code, a cache entry that is garbage, a planted module, a filter that would run for
hours.  Every one must end in a CkError (naming what to fix) or be repaired, and
nothing may be written outside the cache folder.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import time
from pathlib import Path

import pytest

from ck_core import ConfigError, KernelKey, MissingKernel, Registry, get_manager
from ck_core.cache import ORPHAN_SECONDS, KernelCache
from ck_core.errors import CkError, FilterError
from ck_core.filters import MAX_DEPTH, MAX_INT, MAX_LEN, MAX_STR, compile_filter
from ck_core.winners import Winners

MATERIAL = {"core": "0", "template": "t", "compiler": "c", "target": "x"}


def _files_under(folder: Path) -> set:
    return {p for p in folder.rglob("*")}


def _gemm_record(arch="gfx942", backend="triton", **alg):
    pytest.importorskip("ck_gemm")
    reg = Registry.from_enumeration("gemm", arch, backend, dtypes=["fp16"], layouts=["rcr"])
    rec = next(iter(reg)).to_dict()
    rec["algorithm"].update(alg)
    rec.pop("name")
    return rec


def _registry_file(tmp_path, arch, records) -> Path:
    p = tmp_path / "reg.json"
    p.write_text(json.dumps({"format": "ck-dispatcher.registry/1", "arch": arch, "kernels": records}))
    return p


# -- 6. path traversal -------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["triton", "ck"])
def test_traversal_record_is_refused_and_nothing_escapes(tmp_path, monkeypatch, backend):
    """A record whose epilogue is ``x/../../../ESCAPED`` is refused at import, names the
    field, and a build of a hand-made key with that text writes only inside the cache."""
    if "gfx942" not in get_manager().archs():
        pytest.skip("ck-arch-gfx942 not installed")
    cache = tmp_path / "deep" / "er" / "cache"
    monkeypatch.setenv("CK_CACHE_DIR", str(cache))
    rec = _gemm_record(backend=backend, epilogue="x/../../../ESCAPED")
    before = _files_under(tmp_path)
    with pytest.raises(ConfigError, match="epilogue"):
        Registry.import_json(_registry_file(tmp_path, "gfx942", [rec]))
    with pytest.raises(ConfigError, match="epilogue"):
        KernelKey.from_dict(rec)
    # the signature too, and the name form
    bad = dict(rec, signature=dict(rec["signature"], activation="../../ESCAPED"))
    bad["algorithm"] = dict(bad["algorithm"], epilogue="cshuffle")
    with pytest.raises(ConfigError, match="activation"):
        KernelKey.from_dict(bad)
    good = KernelKey.from_dict(dict(rec, algorithm=dict(rec["algorithm"], epilogue="cshuffle")))
    with pytest.raises(MissingKernel):
        KernelKey.from_name(good.name.replace("cshuffle", "x/../../../ESCAPED"))
    # defence in depth: a key built in code with that text still builds only under the cache
    import attrs
    evil = attrs.evolve(good, algorithm=attrs.evolve(good.algorithm, epilogue="x/../../../ESCAPED"))
    mgr = get_manager()
    try:
        mgr.backend(backend).compile(evil, mgr.op("gemm"), mgr.arch("gfx942"), {})
    except CkError:
        pass   # no hipcc / a render that refuses the value: either way, nothing may escape
    after = _files_under(tmp_path)
    new = after - before - {tmp_path / "reg.json"}
    assert all(cache in p.parents or p == cache or p in cache.parents for p in new), sorted(new)
    assert not any("ESCAPED" in str(p) for p in after)


@pytest.mark.parametrize("field, value, what", [
    ("tile_m", -64, "tile_m"),
    ("tile_m", "64", "tile_m"),
    ("tile_m", 64.0, "tile_m"),
    ("tile_m", True, "tile_m"),
    ("pad_m", "yes", "pad_m"),
    ("pipeline", "comp v3", "pipeline"),
    ("scheduler", "sometimes", "scheduler"),
    ("variant", ["tile"], "variant"),
    ("nonsense", 1, "nonsense"),
])
def test_gemm_fields_are_typed(field, value, what):
    rec = _gemm_record()
    rec["algorithm"][field] = value
    with pytest.raises(ConfigError, match=what):
        KernelKey.from_dict(rec)


def test_illegal_key_is_refused_at_import(tmp_path):
    """256 KiB of LDS on a 64 KiB arch: the enumeration would never make it, import refuses it."""
    rec = _gemm_record(arch="gfx942", backend="numpy", tile_m=256, tile_n=256, tile_k=256)
    with pytest.raises(ConfigError, match="LDS"):
        Registry.import_json(_registry_file(tmp_path, "gfx942", [rec]))


def test_conv_and_fmha_fields_are_typed():
    pytest.importorskip("ck_conv")
    pytest.importorskip("ck_fmha")
    cases = (("conv", "gfx942", "numpy", dict(directions=["forward"], dtypes=["fp16"], ndims=[2])),
             ("fmha", "gfx942", "numpy", dict(families=["fwd"])),
             ("fmha", "sm90", "triton", dict(families=["fwd"])))
    for op, arch, backend, options in cases:
        if arch not in get_manager().archs():
            continue
        rec = next(iter(Registry.from_enumeration(op, arch, backend, **options))).to_dict()
        assert KernelKey.from_dict(rec).name == rec["name"]
        for part in ("signature", "algorithm"):
            for field, value in rec[part].items():
                if isinstance(value, str):
                    bad = json.loads(json.dumps(rec))
                    bad[part][field] = "a/../../b"
                    with pytest.raises(ConfigError, match=field):
                        KernelKey.from_dict(bad)
                elif isinstance(value, int) and not isinstance(value, bool):
                    bad = json.loads(json.dumps(rec))
                    bad[part][field] = "1; system('x')"
                    with pytest.raises(ConfigError, match=field):
                        KernelKey.from_dict(bad)


def test_conv_and_fmha_illegal_keys_are_refused_at_import(tmp_path):
    pytest.importorskip("ck_conv")
    pytest.importorskip("ck_fmha")
    if not {"gfx942", "sm90"} <= set(get_manager().archs()):
        pytest.skip("ck-arch-gfx942 / ck-arch-sm90 not installed")
    conv = next(iter(Registry.from_enumeration("conv", "gfx942", "numpy", directions=["forward"],
                                               dtypes=["fp16"], ndims=[2], specializations=["default"])))
    rec = conv.to_dict()
    del rec["name"]
    rec["algorithm"].update(tile_m=256, tile_n=256, tile_k=128, pipeline="compv4")   # 256 KiB of LDS
    with pytest.raises(ConfigError, match="LDS"):
        Registry.from_dict({"format": "ck-dispatcher.registry/1", "arch": "gfx942", "kernels": [rec]})
    ck = next(iter(Registry.from_enumeration("fmha", "gfx942", "numpy", families=["fwd"]))).to_dict()
    del ck["name"]
    ck["signature"]["tile"][0] += 16          # a tile CK's codegen never makes
    with pytest.raises(ConfigError, match="no such instance"):
        Registry.from_dict({"format": "ck-dispatcher.registry/1", "arch": "gfx942", "kernels": [ck]})
    tri = next(iter(Registry.from_enumeration("fmha", "gfx942", "triton", families=["fwd"]))).to_dict()
    del tri["name"]
    tri["algorithm"]["variant"] = "tma"        # a Hopper-only variant on CDNA3
    with pytest.raises(ConfigError, match="Hopper"):
        Registry.from_dict({"format": "ck-dispatcher.registry/1", "arch": "gfx942", "kernels": [tri]})


@pytest.mark.parametrize("content", [
    b"[]", b"\x00\xff\xfe garbage \x81", b'{"format": "ck-dispatcher.registry/1"}',
    b'{"format": "ck-dispatcher.registry/1", "arch": 942, "kernels": []}',
    b'{"format": "ck-dispatcher.registry/1", "arch": "gfx942", "kernels": {}}',
    b'{"format": "ck-dispatcher.registry/1", "arch": "gfx942", "kernels": [], "extra": 1}',
    b'{"format": "ck-dispatcher.registry/1", "arch": "gfx942", "kernels": [[]]}',
    b'{"format": "ck-dispatcher.registry/1", "arch": "gfx942", "kernels": [{"op": "gemm"}]}',
    b'{"format": "ck-dispatcher.registry/1", "arch": "../x", "kernels": []}',
    b"[" * 200_000 + b"]" * 200_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
], ids=["list", "binary", "no-arch", "arch-int", "kernels-dict", "unknown-field", "record-list",
        "record-missing", "arch-path", "deep-list", "deep-dict"])
def test_malformed_registry_json_is_a_config_error_quickly(tmp_path, content):
    p = tmp_path / "reg.json"
    p.write_bytes(content)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError):
        Registry.import_json(p)
    assert time.perf_counter() - t0 < 2.0


# -- 7 and 8: plugin-specific, in plugins/gemm/tests/test_ck_template_untrusted.py (source
# injection into CK Tile C++) and plugins/conv/tests/test_dw_codegen_untrusted.py (generated
# modules are never loaded from files)


# -- 9. filter cost ------------------------------------------------------------------------------

FIELDS = {"pipeline": "compv3", "tile_m": 128, "hdim_q": 128, "dtype": "fp16", "tile": (128, 64),
          "pad_m": True, "pad_n": False}


@pytest.mark.parametrize("expr", [
    "c.pipeline * 300000000 == 'x'",
    "c.dtype * c.tile_m * 1000000 == 'x'",
    "(c.pipeline,) * 100000000 == ()",
    "'%0999999999d' % c.tile_m == 'x'",
    "c.pipeline + c.pipeline == 'x'",
    f"c.tile_m * {MAX_INT} * {MAX_INT} > 0",
])
def test_expensive_filters_fail_fast(expr):
    pred = compile_filter(expr)
    t0 = time.perf_counter()
    with pytest.raises(FilterError):
        pred(FIELDS)
    assert time.perf_counter() - t0 < 0.1


@pytest.mark.parametrize("expr", [
    f"c.tile_m == {10 ** 30}",
    f"c.pipeline == '{'x' * (MAX_STR + 1)}'",
    "c.tile_m == 1e400",
    "c.tile_m" + " + 1" * (MAX_DEPTH + 2) + " == 1",
    "-(" * (MAX_DEPTH + 2) + "c.tile_m" + ")" * (MAX_DEPTH + 2) + " == 1",
    "(" * 300 + "c.tile_m" + ")" * 300,
    "not " * (MAX_DEPTH + 2) + "c.tile_m",
    " or ".join(["c.tile_m == 1"] * 150),
    "c.tile_m == 1 or " * (MAX_LEN // 10),
])
def test_filter_bounds_at_compile_time(expr):
    with pytest.raises(FilterError):
        compile_filter(expr)


def test_filter_time_budget(monkeypatch):
    from ck_core import filters

    monkeypatch.setattr(filters, "TIME_BUDGET", -1.0)   # any evaluation overruns
    with pytest.raises(FilterError, match="budget"):
        compile_filter("c.tile_m == 128")(FIELDS)


@pytest.mark.parametrize("expr, want", [
    ("c.tile_m == 128 and c.pipeline == 'compv3'", True),                 # README
    ("c.hdim_q == 128 and c.pipeline in ('qr', 'qr_async')", False),      # README
    ("c.tile_m * 2 == 256 and -c.tile_m < 0", True),
    ("c.tile_m // 3 + c.tile_m % 3 - 1 == 43", True),
    ("c.tile == (128, 64) and 'v3' in c.pipeline", True),
    ("c.pad_m + c.pad_n == 1", True),
])
def test_legit_filters_still_work(expr, want):
    assert compile_filter(expr)(FIELDS) is want


def test_binary_filter_file(tmp_path):
    from ck_core.filters import load_filter_file

    p = tmp_path / "f.txt"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FilterError):
        load_filter_file(p)


# -- 10. cache faults -----------------------------------------------------------------------------

def _build_counter():
    calls = []

    def build():
        calls.append(1)
        return b"BLOB" * 8, {"n": len(calls)}
    return calls, build


@pytest.mark.parametrize("damage", ["json-list", "json-binary", "json-dir", "bin-dir", "json-string",
                                    "bin-missing", "folder-is-file"])
def test_damaged_entries_are_rebuilt(tmp_path, damage, caplog):
    cache = KernelCache(tmp_path / "k")
    calls, build = _build_counter()
    cache.get_or_build("k", MATERIAL, build)
    bin_path, meta_path = cache.entry("k", MATERIAL)
    if damage == "json-list":
        meta_path.write_text("[]")
    elif damage == "json-binary":
        meta_path.write_bytes(b"\x00\xff\xfe\x81garbage")
    elif damage == "json-string":
        meta_path.write_text('"sha256"')
    elif damage == "json-dir":
        meta_path.unlink()
        meta_path.mkdir()
        (meta_path / "x").write_text("x")
    elif damage == "bin-dir":
        bin_path.unlink()
        bin_path.mkdir()
        (bin_path / "x").write_text("x")
    elif damage == "bin-missing":
        bin_path.unlink()
    elif damage == "folder-is-file":
        import shutil
        shutil.rmtree(bin_path.parent)
        bin_path.parent.write_text("x")
    with caplog.at_level(logging.WARNING):
        blob, meta, hit = cache.get_or_build("k", MATERIAL, build)
    assert not hit and blob == b"BLOB" * 8 and len(calls) == 2
    blob, meta, hit = cache.get_or_build("k", MATERIAL, build)      # and it stays repaired
    assert hit and len(calls) == 2


def test_cache_paths_are_hashes(tmp_path):
    cache = KernelCache(tmp_path)
    name = "gemm_x/../../../ESCAPED.gfx942.triton"
    bin_path, meta_path = cache.entry(name, MATERIAL)
    assert tmp_path in bin_path.parents and "ESCAPED" not in str(bin_path)
    cache.get_or_build(name, MATERIAL, lambda: (b"1", {}))
    assert json.loads(meta_path.read_text())["kernel"] == name     # the readable name is metadata
    assert not any("ESCAPED" in str(p) for p in tmp_path.parent.rglob("*"))


def test_read_only_cache_still_builds(tmp_path, monkeypatch, caplog):
    import ck_core.cache as C

    root = tmp_path / "ro"
    root.mkdir()
    os.chmod(root, 0o555)

    def refuse(*a, **k):   # what a read-only file system answers (root ignores chmod)
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(C.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(C, "file_lock", refuse)
    C._warned.clear()
    calls, build = _build_counter()
    try:
        with caplog.at_level(logging.WARNING, logger="ck_core.cache"):
            blob, meta, hit = KernelCache(root).get_or_build("k", MATERIAL, build)
            KernelCache(root).get_or_build("k2", MATERIAL, build)
    finally:
        os.chmod(root, 0o755)
    assert blob == b"BLOB" * 8 and not hit and len(calls) == 2
    assert sum("cannot be written" in r.message for r in caplog.records) == 1


def test_orphan_temp_files_are_swept(tmp_path):
    cache = KernelCache(tmp_path)
    calls, build = _build_counter()
    cache.get_or_build("k", MATERIAL, build)
    folder = cache.entry("k", MATERIAL)[0].parent
    old, young = folder / ".tmp-killed1", folder / ".tmp-writing"
    old.write_bytes(b"x" * 100)
    young.write_bytes(b"y")
    past = time.time() - ORPHAN_SECONDS - 60
    os.utime(old, (past, past))
    # the next write into that folder sweeps it (find a second entry that lands there)
    other = next(dict(MATERIAL, target=str(i)) for i in range(10_000)
                 if cache.entry("k", dict(MATERIAL, target=str(i)))[0].parent == folder)
    cache.get_or_build("k", other, build)
    assert not old.exists() and young.exists()
    stale = folder / ".tmp-killed2"
    stale.write_bytes(b"z")
    os.utime(stale, (past, past))
    assert cache.sweep() == 1 and not stale.exists()
    assert cache.clear() == 2 and not tmp_path.exists()


def test_cache_dir_naming_a_file(tmp_path, monkeypatch):
    from ck_core import knobs

    f = tmp_path / "file"
    f.write_text("x")
    for value in (f, f / "sub"):
        monkeypatch.setenv("CK_CACHE_DIR", str(value))
        with pytest.raises(ConfigError, match="CK_CACHE_DIR"):
            knobs.cache_dir()
        with pytest.raises(ConfigError, match="is a file"):
            KernelCache().get_or_build("k", MATERIAL, lambda: (b"", {}))


def test_tests_never_use_the_real_cache():
    from ck_core import knobs
    from ck_core.tuned_data import user_dir

    real = Path.home() / ".cache" / "ck-dispatcher"
    assert real not in knobs.cache_dir().parents and knobs.cache_dir() != real
    assert "CK_TUNED_DIR" not in os.environ and real not in user_dir().parents
    assert user_dir() == Path(os.environ["CK_TUNING_DB"]).with_name("tuning.d")
    assert os.environ["XDG_CACHE_HOME"] != str(Path.home() / ".cache")


class _P:
    op = "toy"

    def bucket(self):
        return "b"

    def to_dict(self):
        return {"m": 1}


def _store_doc(value, **top):
    doc = {"format": "ck-dispatcher.tuned-data/1", "op": "toy", "arch": "a1",
           "provenance": {"command": "t", "date": "2026-11-29", "device": "cpu", "source": "t"},
           "tables": {"kernels": {"key": ["backend", "bucket"],
                                  "entries": [{"key": ["numpy", '"b"'], "value": value}]}}}
    doc.update(top)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("content", [
    b"\x00\xff\xfe\x81", b"[]", b'{"tables": []}', _store_doc("gemm"), _store_doc({"kernel": 3}),
    _store_doc({"kernel": "g", "seconds": "fast"}), _store_doc({"kernel": "g"}, format="other"),
    _store_doc({"kernel": "g"}, op="other"), b"[" * 100_000,
])
def test_tuning_store_garbage_is_a_config_error(tmp_path, monkeypatch, content):
    from ck_core import tuned_data

    p = tmp_path / "store" / "toy" / "a1.json"
    p.parent.mkdir(parents=True)
    p.write_bytes(content)
    monkeypatch.setenv("CK_TUNED_DIR", str(tmp_path / "store"))
    tuned_data.clear_cache()
    try:
        with pytest.raises(ConfigError) as err:
            Winners().lookup("a1", "numpy", _P())
        assert str(p) in str(err.value)
    finally:
        tuned_data.clear_cache()


def test_tuning_store_round_trip(tmp_path, monkeypatch):
    from ck_core import tuned_data

    monkeypatch.setenv("CK_TUNED_DIR", str(tmp_path / "store"))
    tuned_data.clear_cache()
    try:
        t = Winners()
        t.record("gfx942", "triton", _P(), "gemm_k", 1e-3, [{"kernel": "gemm_k", "seconds": 1e-3}])
        assert t.save() == tmp_path / "store" / "toy" / "gfx942.json"
        tuned_data.clear_cache()
        assert Winners().lookup("gfx942", "triton", _P()) == "gemm_k"
        assert Winners().lookup("gfx942", "numpy", _P()) is None
    finally:
        tuned_data.clear_cache()


def test_cache_clear_removes_the_ck_sources_too(tmp_path, monkeypatch, capsys):
    from ck_core.backends.ck_backend import source_dir
    from ck_core.cli import main

    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path / "cache"))
    src = source_dir()
    (src / "ab").mkdir(parents=True)
    (src / "ab" / "k.cpp").write_text("// generated")
    assert main(["cache", "clear"]) == 0
    assert not src.exists()
    assert "generated CK sources" in capsys.readouterr().out


def test_test_sessions_redirect_the_triton_cache():
    import os

    assert os.environ["TRITON_CACHE_DIR"].startswith(os.path.dirname(os.environ["CK_CACHE_DIR"]))
