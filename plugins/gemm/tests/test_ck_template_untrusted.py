"""Source injection into the generated CK Tile C++: only checked ints and table spellings reach it."""
import attrs
import pytest

from ck_core import ConfigError, KernelKey, Registry, get_manager
from ck_core.errors import CkError
from ck_gemm.backends.ck.template import render_ck


@pytest.fixture
def ck_key():
    if "gfx942" not in get_manager().archs():
        pytest.skip("ck-arch-gfx942 not installed")
    return next(iter(Registry.from_enumeration("gemm", "gfx942", "ck", dtypes=["fp16"], layouts=["rcr"])))


def test_tile_m_carrying_code_is_refused_at_import(ck_key):
    rec = ck_key.to_dict()
    del rec["name"]
    rec["algorithm"]["tile_m"] = '128>, decltype(system("id")), ck_tile::sequence<1'
    with pytest.raises(ConfigError, match="tile_m"):
        KernelKey.from_dict(rec)


@pytest.mark.parametrize("field, value", [
    ("tile_m", 'system("id")'), ("tile_m", 128.5), ("tile_m", True), ("tile_m", -128),
    ("epilogue", "*/ system(0); /*"), ("pipeline", 'compv3<int>; int x = system("id")'),
    ("scheduler", "Intrawave; system(0)"), ("pad_m", "true; system(0)"),
])
def test_renderer_refuses_unchecked_values(ck_key, field, value):
    """Even a key built in code (never imported) cannot carry text into the source."""
    evil = attrs.evolve(ck_key, algorithm=attrs.evolve(ck_key.algorithm, **{field: value}))
    with pytest.raises(CkError, match=field):
        render_ck(evil)


@pytest.mark.parametrize("field, value", [("activation", "*/ system(0); /*"), ("dtype_c", "int; system(0)"),
                                          ("layout", "r\"c"), ("num_d", "1); system(0")])
def test_renderer_refuses_unchecked_signature_values(ck_key, field, value):
    evil = attrs.evolve(ck_key, signature=attrs.evolve(ck_key.signature, **{field: value}))
    with pytest.raises(CkError, match=field):
        render_ck(evil)


def test_rendered_source_holds_the_key_values_only(ck_key):
    src = render_ck(ck_key).source
    a = ck_key.algorithm
    assert f"sequence<{a.tile_m}, {a.tile_n}, {a.tile_k}>" in src
    assert "system" not in src and src.count("{") == src.count("}")
