"""Progress on stderr for long CLI steps.

:func:`busy`: a step with no natural count (enumerating a kernel space), shown only on a
terminal with CK_PROGRESS on, and only once it has run for ``after`` seconds, so quick commands
and pipes stay clean.  :class:`Progress`: a loop with a count (benchmark cases, sweep rows): a
bar on a terminal, a periodic one-line update elsewhere, nothing when quiet.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time

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


def _clock(secs: float) -> str:
    secs = int(secs)
    return f"{secs // 60}m{secs % 60:02d}s" if secs >= 60 else f"{secs}s"


class Progress:
    """Counted progress of a long loop (benchmark cases, sweep rows), on stderr.

    A terminal gets a tqdm bar (when CK_PROGRESS is on and tqdm is installed); anything else
    (a log file, CI, a pipe) gets one plain line every ``every`` seconds, so a long run shows it
    is alive without filling its log; ``quiet`` shows nothing.  ``update(label=...)`` counts one
    item done and names the one just finished.
    """

    def __init__(self, total: int, desc: str, unit: str = "case", quiet: bool = False,
                 every: float = 30.0, stream=None, position: int = 0):
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.stream = stream or sys.stderr
        self.n, self.last = 0, ""
        self._t0 = time.monotonic()
        self._bar = None
        self._done = threading.Event()
        self._thread = None
        self.mode = ("off" if quiet or not knobs.get("CK_PROGRESS") else "bar" if self._tty() else "lines")
        if self.mode == "bar":
            try:
                from tqdm import tqdm
            except ImportError:
                self.mode = "lines"
            else:
                self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, leave=False,
                                 position=position)
        if self.mode == "lines" and every > 0:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def _tty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):
            return False

    def line(self) -> str:
        el = time.monotonic() - self._t0
        s = f"{self.desc}: {self.n}/{self.total} {self.unit}s"
        if self.total:
            s += f" ({100 * self.n // self.total}%)"
        s += f", {_clock(el)} elapsed"
        if 0 < self.n < self.total:
            s += f", ~{_clock(el / self.n * (self.total - self.n))} left"
        return s + (f"; last: {self.last}" if self.last else "")

    def _tick(self):
        while not self._done.wait(self.every):
            print(self.line(), file=self.stream, flush=True)

    def update(self, n: int = 1, label: str = "") -> None:
        self.n += n
        self.last = label or self.last
        if self._bar is not None:
            self._bar.update(n)
            if label:
                self._bar.set_postfix_str(label[:40], refresh=False)

    def each(self, items, label=str):
        """Yield ``items``, counting each as done when the loop comes back for the next one (a
        ``continue`` counts too); closes when the loop ends."""
        try:
            for it in items:
                yield it
                self.update(label=label(it))
        finally:
            self.close()

    def close(self) -> None:
        if self._done.is_set():
            return
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            if time.monotonic() - self._t0 >= self.every:  # a run long enough to have reported says it ended
                print(self.line().replace(" elapsed", " in all"), file=self.stream, flush=True)
        if self._bar is not None:
            self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
