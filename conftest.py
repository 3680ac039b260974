import os

# Triton kernels run through Triton's CPU interpreter in tests, decided once, before
# anything imports a kernel (the interpreter is chosen when @triton.jit decorates).
# On a GPU machine run the tests with CK_TEST_GPU=1 (and -m gpu for the GPU-only ones).
# Ahead-of-time compilation needs real JIT functions: those tests use a subprocess.
if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["ck_core.testing"]


def _ci_slow_ids():
    """The test ids listed in tests/ci_slow.txt (comments after '#')."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "ci_slow.txt")
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.split("#")[0].strip() for ln in f]
    except OSError:
        return ()
    return tuple(ln for ln in lines if ln)


def pytest_collection_modifyitems(config, items):
    # runs before -m deselects: the listed tests join the `slow` marker CI skips
    import pytest

    ids = _ci_slow_ids()
    if not ids:
        return
    for item in items:
        nid = item.nodeid
        if any(nid == i or (("[" not in i) and nid.startswith(i + "[")) for i in ids):
            item.add_marker(pytest.mark.slow)


pytest_collection_modifyitems.tryfirst = True
