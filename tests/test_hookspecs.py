import inspect

from ck_core import hookspecs


def _specs():
    return [(n, f) for n, f in vars(hookspecs).items() if n.startswith("ck_") and callable(f)]


def test_there_are_hooks_in_every_phase():
    names = {n for n, _ in _specs()}
    assert {"ck_register_ops", "ck_register_archs", "ck_register_backends", "ck_reject_kernel",
            "ck_rank_candidates", "ck_compile_options", "ck_after_run"} <= names


def test_every_hook_is_documented():
    for name, fn in _specs():
        doc = inspect.getdoc(fn)
        assert doc and len(doc) > 60, f"hook {name} lacks a docstring"
        assert "firstresult" in doc, f"hook {name} does not say whether it is firstresult"
        assert "Example" in doc, f"hook {name} has no example"
        assert "return" in doc.lower(), f"hook {name} does not say what it returns"


def test_firstresult_marker_matches_doc():
    for name, fn in _specs():
        opts = getattr(fn, "ck_core_spec", {})
        doc = inspect.getdoc(fn)
        if opts.get("firstresult"):
            assert "firstresult: " in doc or doc.count("firstresult") and "Not firstresult" not in doc, name
        else:
            assert "Not firstresult" in doc, name
