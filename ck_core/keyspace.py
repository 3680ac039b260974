"""KeySpace: a compact description of a set of kernel keys, expanded only as far as asked.

An op whose enumeration is large (conv's Triton realisations: over a million keys on
sm90) gives the Registry one KeySpace instead of a list (``OpSpec.key_space``).  The
Registry then answers ``len``, membership and a problem's candidates without building
every key: a space knows which part of itself a problem can use (the problem fixes
dtype, layout, direction ... of the keys that compute it).

The base class is exact but slow (it expands everything); an op's space overrides
what it can do faster.  Every override must agree with the expansion:
``count() == len(list(space))``, ``key in space == key in set(space)`` and
``candidates(p) == [k for k in space if supports(k, p) is None]`` (in that order).
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional


class KeySpace:
    """A set of KernelKeys of one op, arch and backend, in a fixed order."""

    op: str = ""
    arch: str = ""
    backend: str = ""

    def __iter__(self) -> Iterator:
        raise NotImplementedError

    def count(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key) -> bool:
        members = getattr(self, "_members", None)
        if members is None:
            members = self._members = frozenset(self)
        return key in members

    def candidates(self, problem, supports: Callable) -> list:
        """The keys (in order) for which ``supports(key, problem)`` is None."""
        return [k for k in self if supports(k, problem) is None]


class FilteredSpace(KeySpace):
    """The keys of ``space`` that ``keep(key)`` accepts (``Registry.filter``, arch rules)."""

    def __init__(self, space: KeySpace, keep: Callable):
        self.space, self.keep = space, keep
        self.op, self.arch, self.backend = space.op, space.arch, space.backend
        self._count: Optional[int] = None

    def __iter__(self):
        keep = self.keep
        return (k for k in self.space if keep(k))

    def count(self) -> int:
        if self._count is None:
            self._count = sum(1 for _ in self)
        return self._count

    def __contains__(self, key) -> bool:
        return key in self.space and bool(self.keep(key))

    def candidates(self, problem, supports: Callable) -> list:
        keep = self.keep
        return [k for k in self.space.candidates(problem, supports) if keep(k)]
