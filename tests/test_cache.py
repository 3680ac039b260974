import json
import multiprocessing as mp
import time

from ck_core.cache import KernelCache

MATERIAL = {"core": "0.1.0", "template": "abc", "compiler": "triton-3.6.0", "target": "gfx942"}


def _slow_build(root, marker_dir, idx):
    cache = KernelCache(root)

    def build():
        (marker_dir / f"built-{idx}").write_text("x")
        time.sleep(0.3)
        return b"BINARY-" + b"x" * 1000, {"shared": 1024}

    blob, meta, hit = cache.get_or_build("gemm_k.gfx942.triton", MATERIAL, build)
    assert blob.startswith(b"BINARY-")


def test_two_processes_build_once(tmp_path):
    root, markers = tmp_path / "cache", tmp_path / "markers"
    markers.mkdir()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_slow_build, args=(root, markers, i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(list(markers.iterdir())) == 1          # built once
    bins = list(root.glob("*/*.bin"))
    metas = list(root.glob("*/*.json"))
    assert len(bins) == 1 and len(metas) == 1          # one valid entry
    assert KernelCache(root).load("gemm_k.gfx942.triton", MATERIAL) is not None


def test_corrupted_entry_is_rebuilt(tmp_path):
    cache = KernelCache(tmp_path)
    calls = []

    def build():
        calls.append(1)
        return b"GOOD" * 10, {}

    cache.get_or_build("k", MATERIAL, build)
    _, _, hit = cache.get_or_build("k", MATERIAL, build)
    assert hit and len(calls) == 1
    bin_path, meta_path = cache.entry("k", MATERIAL)
    bin_path.write_bytes(b"BAD!" * 10)                  # bit rot / torn write
    blob, _, hit = cache.get_or_build("k", MATERIAL, build)
    assert not hit and blob == b"GOOD" * 10 and len(calls) == 2
    meta_path.write_text("{truncated")
    _, _, hit = cache.get_or_build("k", MATERIAL, build)
    assert not hit and len(calls) == 3


def test_key_material_changes_entry(tmp_path):
    cache = KernelCache(tmp_path)
    a = cache.entry("k", MATERIAL)[0]
    b = cache.entry("k", dict(MATERIAL, compiler="triton-3.7.0"))[0]
    assert a != b


def test_clear_and_stats(tmp_path):
    cache = KernelCache(tmp_path / "c")
    cache.get_or_build("k1", MATERIAL, lambda: (b"1", {}))
    cache.get_or_build("k2", MATERIAL, lambda: (b"22", {}))
    assert cache.stats()["kernels"] == 2
    assert cache.clear() == 2 and cache.stats()["kernels"] == 0


def _counting_build(calls, payload=b"GOOD" * 10):
    def build():
        calls.append(1)
        return payload, {}
    return build


def test_entry_copied_over_another_specialisation_is_rebuilt(tmp_path):
    """The record carries the digest of the key material it was built for: an entry of the same
    kernel copied over another specialisation's entry (binary and record, consistent with each
    other) is not loaded as that specialisation."""
    cache = KernelCache(tmp_path, extra_roots=[])
    other = dict(MATERIAL, attrs="aligned")
    cache.get_or_build("k", MATERIAL, lambda: (b"UNALIGNED" * 4, {}))
    cache.get_or_build("k", other, lambda: (b"ALIGNED" * 4, {}))
    (a_bin, a_rec), (b_bin, b_rec) = cache.entry("k", MATERIAL), cache.entry("k", other)
    rec = json.loads(a_rec.read_text())
    assert rec["digest"] == cache.digest("k", MATERIAL) and rec["material"]["template"] == "abc"
    b_bin.write_bytes(a_bin.read_bytes())
    b_rec.write_bytes(a_rec.read_bytes())
    assert cache.load("k", other) is None
    calls = []
    blob, _, hit = cache.get_or_build("k", other, _counting_build(calls, b"ALIGNED" * 4))
    assert not hit and calls == [1] and blob == b"ALIGNED" * 4
    assert cache.load("k", other)[0] == b"ALIGNED" * 4 and cache.load("k", MATERIAL)[0] == b"UNALIGNED" * 4


def test_linked_entry_folder_is_never_written_through(tmp_path):
    """An entry folder that is a symbolic link (to a folder outside the cache) is not read from nor
    written through: the link is removed and the entry rebuilt inside the cache."""
    root, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    cache = KernelCache(root, extra_roots=[])
    bin_path, rec_path = cache.entry("k", MATERIAL)
    root.mkdir()
    bin_path.parent.symlink_to(outside, target_is_directory=True)
    calls = []
    blob, _, hit = cache.get_or_build("k", MATERIAL, _counting_build(calls))
    assert not hit and calls == [1] and blob == b"GOOD" * 10
    assert list(outside.iterdir()) == [], "wrote outside the cache"
    assert not bin_path.parent.is_symlink() and bin_path.is_file() and rec_path.is_file()
    assert cache.get_or_build("k", MATERIAL, _counting_build(calls))[2] and calls == [1]


def test_linked_entry_files_are_not_followed(tmp_path):
    """A binary, record or lock that is a link (e.g. to a file outside the cache holding a forged
    entry) is an unreadable entry: rebuilt, the link replaced, its target untouched."""
    root, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    cache = KernelCache(root, extra_roots=[])
    cache.get_or_build("k", MATERIAL, lambda: (b"GOOD" * 10, {}))
    bin_path, rec_path = cache.entry("k", MATERIAL)
    for victim in (bin_path, rec_path, bin_path.with_suffix(".lock")):
        target = outside / (victim.name + ".target")
        target.write_bytes(victim.read_bytes() if victim.exists() else b"")
        before = target.read_bytes()
        victim.unlink()
        victim.symlink_to(target)
        if victim != bin_path.with_suffix(".lock"):
            assert cache.load("k", MATERIAL) is None
            calls = []
            blob, _, hit = cache.get_or_build("k", MATERIAL, _counting_build(calls))
            assert not hit and calls == [1] and blob == b"GOOD" * 10
        else:   # the lock: taken only to build, a link there is replaced, not opened
            bin_path.unlink()
            cache.get_or_build("k", MATERIAL, lambda: (b"GOOD" * 10, {}))
        assert not victim.is_symlink() and target.read_bytes() == before


def test_read_only_roots_are_searched_after_the_cache(tmp_path):
    """A prebuilt kernel set (another cache root) is read, never written: its entries load without
    building; what is missing from both is built into the cache's own root."""
    prebuilt = tmp_path / "set" / "kernels"
    KernelCache(prebuilt, extra_roots=[]).get_or_build("k", MATERIAL, lambda: (b"PREBUILT", {}))
    (tmp_path / "set").chmod(0o555)
    try:
        cache = KernelCache(tmp_path / "cache", extra_roots=[prebuilt])
        calls = []
        blob, _, hit = cache.get_or_build("k", MATERIAL, _counting_build(calls))
        assert hit and blob == b"PREBUILT" and calls == []
        blob, _, hit = cache.get_or_build("k2", MATERIAL, _counting_build(calls))
        assert not hit and calls == [1] and cache.entry("k2", MATERIAL)[0].is_file()
    finally:
        (tmp_path / "set").chmod(0o755)


def test_kernel_sets_knob(tmp_path, monkeypatch):
    from ck_core.cache import prebuilt_roots

    (tmp_path / "a" / "kernels").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("CK_KERNEL_SETS", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert prebuilt_roots()[:2] == [tmp_path / "a" / "kernels", tmp_path / "b"]
    monkeypatch.setenv("CK_KERNEL_SETS", "none")
    assert prebuilt_roots() == []
