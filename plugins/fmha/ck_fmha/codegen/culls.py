"""Bookkeeping the FMHA family generators share: why candidates were culled (counted, logged at
debug level) and CK's pad-flag spellings.  Split from :mod:`.enumerate` (issue #30) so that the
generators of each family group can live in modules of their own.
"""
from __future__ import annotations

import itertools
import logging
from collections import Counter
from typing import Callable, Tuple

logger = logging.getLogger("ck_fmha.codegen.enumerate")   # the generators' log, as before the split



class _Culls:
    """Counts (and at debug level logs) why candidates were dropped."""

    __slots__ = ("family", "arch", "debug", "counts")

    def __init__(self, family: str, arch: str):
        self.family = family
        self.arch = arch
        self.debug = logger.isEnabledFor(logging.DEBUG)
        self.counts: Counter = Counter()

    def cull(self, reason: str, what: Callable[[], str]) -> None:
        self.counts[reason] += 1
        if self.debug:
            logger.debug("%s/%s: culled %s: %s", self.family, self.arch, what(), reason)

    def cull_many(self, reason: str, n: int, what: Callable[[], str]) -> None:
        self.counts[reason] += n
        if self.debug:
            logger.debug("%s/%s: culled %d (%s): %s", self.family, self.arch, n, what(), reason)

    def summary(self, kept: int) -> None:
        if self.debug:
            logger.debug(
                "%s/%s: kept %d; culled %s", self.family, self.arch, kept,
                dict(self.counts.most_common()) or "none",
            )


_TF = (True, False)
_FT = (False, True)


_PAD_CODES = {"".join(c): tuple(x == "t" for x in c) for c in itertools.product("tf", repeat=4)}


def _pads(code: str) -> Tuple[bool, bool, bool, bool]:
    """CK's pad flags written as 't'/'f' letters: 'tftt' -> (spad, skpad, dpad, dvpad)."""
    return _PAD_CODES[code]
