import os

# Triton kernels run through Triton's CPU interpreter in tests, decided once, before
# anything imports a kernel (the interpreter is chosen when @triton.jit decorates).
# On a GPU machine run the tests with CK_TEST_GPU=1 (and -m gpu for the GPU-only ones).
# Ahead-of-time compilation needs real JIT functions: those tests use a subprocess.
if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["ck_core.testing"]
