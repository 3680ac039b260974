import pytest

from ck_core.errors import CkError, FilterError
from ck_core.filters import compile_filter, load_filter_file

FIELDS = {"hdim_q": 128, "pipeline": "qr_async", "tile_m": 64, "dtype": "fp16"}


@pytest.mark.parametrize("expr, want", [
    ("c.hdim_q == 128 and c.pipeline in ('qr', 'qr_async')", True),
    ("c.hdim_q == 64 or c.tile_m >= 128", False),
    ("not c.dtype == 'bf16'", True),
    ("c.tile_m * 2 == 128", True),
    ("32 < c.tile_m <= 64", True),
    ("c.pipeline not in ['qr']", True),
])
def test_valid_filters(expr, want):
    assert compile_filter(expr)(FIELDS) is want


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')",
    "c.__class__",
    "c.tile_m.__class__.__mro__",
    "c._d",
    "open('/etc/passwd')",
    "c.dtype.upper() == 'FP16'",
    "(lambda: 1)()",
    "[x for x in (1, 2)]",
    "c.pipeline[0] == 'q'",
    "os.system",
    "import os",
    "c.tile_m if True else 1",
    "",
])
def test_rejected_filters(expr):
    with pytest.raises(FilterError) as err:
        compile_filter(expr)
    assert isinstance(err.value, CkError)


def test_call_message_says_calls_are_not_allowed():
    with pytest.raises(FilterError, match="calls are not allowed"):
        compile_filter("__import__('os').system('true')")


def test_unknown_field_is_named():
    with pytest.raises(FilterError, match="c.nope"):
        compile_filter("c.nope == 1")(FIELDS)


def test_filter_file(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("# keep h128\nc.hdim_q == 128\nc.tile_m < 100  # small tiles\n")
    assert load_filter_file(f)(FIELDS)
    f.write_text("c.hdim_q == 128\nc.__dict__\n")
    with pytest.raises(FilterError, match=r"f.txt:2"):
        load_filter_file(f)
