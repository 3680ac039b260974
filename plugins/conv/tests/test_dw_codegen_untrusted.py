"""Generated depthwise kernels run from memory: a planted file in the cache folder is never executed."""
import hashlib
import inspect
import os
from pathlib import Path

import pytest

pytest.importorskip("triton")
from ck_conv.backends.triton import dw_codegen  # noqa: E402


def test_planted_generated_module_is_never_run(tmp_path, monkeypatch):
    marker = tmp_path / "PWNED"
    payload = f"open({str(marker)!r}, 'w').write('x')\nkernel = None\n"
    # where the old code wrote and imported its modules: <cache>/ck_conv_gen/<stem>_<sha16>.py
    for root in (Path(os.environ["CK_CACHE_DIR"]), tmp_path):
        folder = root / "ck_conv_gen"
        folder.mkdir(parents=True, exist_ok=True)
        for stem, src in (("dw_bwd_weight_1x3x3", dw_codegen.render((1, 3, 3))),
                          ("dw_fwd_rows_2_3x3", dw_codegen.render_rows(2, 3, 3))):
            (folder / f"{stem}_{hashlib.sha256(src.encode()).hexdigest()[:16]}.py").write_text(payload)
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path))
    dw_codegen.dw_bwd_weight_kernel.cache_clear()
    dw_codegen.dw_fwd_rows_kernel.cache_clear()
    k1 = dw_codegen.dw_bwd_weight_kernel((1, 3, 3))
    k2 = dw_codegen.dw_fwd_rows_kernel(2, 3, 3)
    assert k1 is not None and k2 is not None
    assert not marker.exists()
    # what Triton compiles is the source rendered here
    assert "acc8" in inspect.getsource(k1.fn) and "acc1 +=" in inspect.getsource(k2.fn)
    assert inspect.getsource(k1.fn) in dw_codegen.render((1, 3, 3))


def test_source_survives_a_cleared_line_cache():
    import linecache

    k = dw_codegen.dw_bwd_weight_kernel((1, 1, 2))
    linecache.clearcache()
    assert "acc1" in inspect.getsource(k.fn)


@pytest.mark.parametrize("bad", [("1); import os; os.system('x'); (1", 3, 3), (0, 3, 3), (1, 3, 9999), (True, 1, 1), (1.5, 1, 1)])
def test_only_small_ints_reach_the_template(bad):
    with pytest.raises(ValueError):
        dw_codegen.render(bad)
