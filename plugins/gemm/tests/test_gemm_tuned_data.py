"""The GEMM winners come from ck_gemm/tuned/sm90.json through ck_core.tuned_data (as h100_tuned.json held them)."""
import pytest

from ck_core import tuned_data
from ck_gemm.backends.triton import GemmConfig
from ck_gemm.heuristics import TUNED_DIR, load_table, pick_config

#: a frozen copy of rows of the old h100_tuned.json (32 entries)
FROZEN = [("bf16", "rcr", 16, 4096, 4096, "tri_plain_m16n64k256_g1_w4_s3_sk2"),
          ("bf16", "rcr", 4096, 14336, 4096, "tri_tma_persistent_cs_m128n256k64_g8_w8_s3_sk1_e2"),
          ("fp16", "rcr", 128, 14336, 4096, "tri_tma_cs_m64n128k64_g8_w4_s4_sk1"),
          ("fp16", "rrr", 8192, 8192, 8192, "tri_tma_persistent_m128n256k64_g8_w8_s3_sk1")]


@pytest.fixture
def user_store(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "tuning.json"))
    tuned_data.clear_cache()
    yield tmp_path
    tuned_data.clear_cache()


def test_rows_equal_the_old_table(user_store):
    rows = load_table("sm90")
    assert len(rows) == 32
    for dt, lay, m, n, k, name in FROZEN:
        assert (dt, lay, m, n, k, GemmConfig.from_name(name)) in rows
    assert load_table("gfx942") == ()
    t = tuned_data.table("gemm", "sm90", "kernels", TUNED_DIR)
    assert t.provenance["date"] == "2026-11-22" and "H100" in t.provenance["device"]
    assert all(t.provenance[f] for f in tuned_data.PROVENANCE_FIELDS)


def test_user_winner_overrides_the_shipped_one(user_store):
    assert pick_config(16, 4096, 4096, "bf16", "sm90") == GemmConfig.from_name(FROZEN[0][5])
    mine = "tri_plain_m32n64k128_g1_w4_s4_sk1"
    bucket = '["bf16","bf16","rcr",0,"add","none",1,16,4096,4096]'
    tuned_data.write("gemm", "sm90", "kernels", [(("triton", bucket), {"kernel": "k", "config": mine})],
                     command="test", device="none", source="test")
    assert pick_config(16, 4096, 4096, "bf16", "sm90") == GemmConfig.from_name(mine)
    assert len(load_table("sm90")) == 32


def test_fp8_takes_the_16bit_winners_at_twice_the_k_tile(user_store):
    """No fp8 rows: the bf16/fp16 winners' persistent TMA kernels join the fp8 registry with BLOCK_K
    doubled (same bytes a stage), and pick_config names them (H100 2026-11-27: 1.04-1.10x
    torch._scaled_mm on 4096^3, 8192^3, 2048x28672x4096, where the fp8 registry's best was 0.87-0.93x)."""
    from ck_core import Registry

    assert not [r for r in load_table("sm90") if r[0] in ("fp8", "bf8")]
    big = pick_config(4096, 4096, 4096, "fp8", "sm90")
    assert big == pick_config(4096, 4096, 4096, "bf16", "sm90").evolve(block_k=128)
    assert big.variant.startswith("tma_persistent") and big.block_k == 128
    names = {k.name for k in Registry.from_enumeration("gemm", "sm90", "triton", dtypes=["fp8"], layouts=["rcr"])}
    assert any("128x256x128" in n and "vtmaperscs" in n for n in names)
    # the 16-bit ones keep their own rows and K tiles
    assert pick_config(4096, 4096, 4096, "bf16", "sm90").block_k == 64


def test_one_table_of_winners(user_store):
    """The sweep's winners are held once, in the Dispatcher's ``kernels`` table (issue #30: a second
    ``winners`` table held the same 32 rows under another key grammar)."""
    import json
    from pathlib import Path

    doc = json.loads((Path(TUNED_DIR) / "sm90.json").read_text())
    assert "winners" not in doc["tables"]
    entries = doc["tables"]["kernels"]["entries"]
    assert len(entries) == 32
    for e in entries:
        bucket = json.loads(e["key"][1])
        shape = e["value"]["shape"]
        assert len(shape) == 3 and all(s <= b < 2 * s for s, b in zip(shape, bucket[-3:])), e["key"]
