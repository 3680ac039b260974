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
