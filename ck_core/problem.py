"""The ``Problem`` base: what a caller wants computed, shapes and all."""
from __future__ import annotations

import numbers
from typing import Any, ClassVar, Mapping

import attrs

from .errors import InvalidProblem


def as_int(value):
    """attrs converter: an integral number of another type (``numpy.int64``, a 0-d tensor's
    ``.item()`` is already int) becomes ``int``; anything else (2.7, True, "8") stays for the
    validator to refuse -- ``int()`` would silently truncate it."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    return value


def positive(instance, attribute, value):
    """attrs validator: an int > 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidProblem(
            f"{type(instance).__name__}.{attribute.name} must be a positive integer, got {value!r}"
        )


def non_negative(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidProblem(
            f"{type(instance).__name__}.{attribute.name} must be an integer >= 0, got {value!r}"
        )


def one_of(*choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise InvalidProblem(
                f"{type(instance).__name__}.{attribute.name}={value!r} is not supported; "
                f"use one of {', '.join(map(str, choices))}"
            )
    return check


@attrs.frozen
class Problem:
    """Base of GemmProblem, ConvProblem, FmhaProblem.

    Subclasses are ``@attrs.frozen`` and set the class attribute ``op``.  Values
    are hashable, so a problem keys the dispatcher's selection cache.
    """

    op: ClassVar[str] = ""

    def to_dict(self) -> dict:
        out = {"op": self.op}
        for f in attrs.fields(type(self)):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        data = dict(data)
        op = data.pop("op", cls.op)
        if op != cls.op:
            raise InvalidProblem(f"a {cls.__name__} needs op={cls.op!r}, got op={op!r}")
        names = {f.name: f for f in attrs.fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise InvalidProblem(
                f"{cls.__name__} has no field(s) {', '.join(unknown)}; known: {', '.join(names)}"
            )
        for k, v in list(data.items()):
            if isinstance(v, list):
                data[k] = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        try:
            return cls(**data)
        except TypeError as exc:
            raise InvalidProblem(f"cannot build {cls.__name__}: {exc}") from None

    def input_names(self):
        """The tensors this problem reads (a tuple), or None where the op does not say.

        The dispatcher names a missing or unused tensor from it on the first call.
        """
        return None

    def evolve(self, **changes):
        return attrs.evolve(self, **changes)

    def bucket(self) -> tuple:
        """The tuning-table key of this problem (override to coarsen)."""
        return tuple(sorted((k, str(v)) for k, v in self.to_dict().items()))
