"""A progress line for CLI steps that have no natural count (enumerating a kernel space).

Shown on stderr only when it is a terminal and CK_PROGRESS is on, and only once the
step has run for ``after`` seconds, so quick commands and pipes stay clean.
"""
from __future__ import annotations

import contextlib
import sys
import threading

from . import knobs


@contextlib.contextmanager
def busy(desc: str, after: float = 2.0, enabled=None):
    if enabled is None:
        enabled = knobs.get("CK_PROGRESS") and sys.stderr.isatty()
    if not enabled:
        yield
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield
        return
    done = threading.Event()

    def tick():
        if done.wait(after):
            return
        bar = tqdm(total=None, desc=desc, file=sys.stderr, leave=False, bar_format="{desc}: {elapsed}")
        while not done.wait(0.25):
            bar.refresh()
        bar.close()

    th = threading.Thread(target=tick, daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join()
