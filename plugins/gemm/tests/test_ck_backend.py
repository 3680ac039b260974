"""The ck backend without a HIP toolchain: sources are generated, the error says so plainly."""
import shutil

import pytest

from ck_core import Registry, ToolchainMissing, get_manager

pytest.importorskip("ck_gemm")


@pytest.mark.skipif(shutil.which("hipcc") is not None, reason="a HIP toolchain is present")
def test_ck_backend_reports_missing_hipcc_and_writes_source(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path))
    mgr = get_manager()
    if "gfx942" not in mgr.archs():
        pytest.skip("ck-arch-gfx942 not installed")
    ok, why = mgr.backend("ck").available()
    assert not ok and "hipcc" in why
    reg = Registry.from_enumeration("gemm", "gfx942", "ck", dtypes=["fp16"], layouts=["rcr"])
    key = next(k for k in reg if k.algorithm.pipeline == "compv4")
    with pytest.raises(ToolchainMissing) as err:
        mgr.backend("ck").compile(key, mgr.op("gemm"), mgr.arch("gfx942"), {})
    msg = str(err.value)
    assert "hipcc" in msg and "--offload-arch=gfx942" in msg
    src = next(tmp_path.rglob("*.cpp")).read_text()
    assert f"sequence<{key.algorithm.tile_m}, {key.algorithm.tile_n}, {key.algorithm.tile_k}>" in src
    assert "GemmPipelineAgBgCrCompV4" in src and "ck_tile::half_t" in src
    assert src.count("{") == src.count("}")
    # a registry build through the ck backend reports every kernel, never crashes
    small = Registry("gfx942", list(reg)[:3])
    report = small.build(max_workers=1, progress=False)
    assert len(report.failed) == 3 and not report.built
    assert all("hipcc" in e for e in report.failed.values())
