"""The TMA forward's scratch allocator is set in every thread and context that launches it: Triton keeps the
allocator in a ContextVar, so a process-wide "already set" flag left a second thread (a server's workers,
the autograd engine's) with Triton's null allocator ("no allocator was set") after the first thread's call."""
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


def test_the_allocator_is_set_in_another_thread_after_the_first():
    from triton.runtime import _allocation

    from ck_fmha.backends.triton import launch as L

    L._ensure_allocator()
    assert _allocation._allocator.get() is L._alloc
    seen = []

    def worker():
        L._ensure_allocator()
        seen.append(_allocation._allocator.get() is L._alloc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [True]
