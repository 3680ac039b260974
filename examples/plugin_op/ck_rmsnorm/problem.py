"""RmsNormProblem: y = x / sqrt(mean(x**2, axis=-1) + eps) * w, x of shape rows x cols."""
from __future__ import annotations

from typing import ClassVar

import attrs

from ck_core.errors import InvalidProblem
from ck_core.problem import Problem, as_int, positive

DTYPES = ("fp16", "bf16", "fp32")


def _dtype(instance, attribute, value):
    if value not in DTYPES:
        raise InvalidProblem(f"RmsNormProblem.dtype={value!r} is not supported; use one of {', '.join(DTYPES)}")


def _eps(instance, attribute, value):
    if not isinstance(value, float) or not 0.0 < value < 1.0:
        raise InvalidProblem(f"RmsNormProblem.eps must be a number in (0, 1), got {value!r}")


@attrs.frozen(cache_hash=True)   # frozen and hashable: the Dispatcher caches plans by problem
class RmsNormProblem(Problem):
    """RMSNorm of each row of a ``rows x cols`` matrix, scaled by a weight vector of ``cols``."""

    op: ClassVar[str] = "rmsnorm"
    # every field documents itself: `ck run rmsnorm --help` prints these lines
    rows: int = attrs.field(converter=as_int, validator=positive, metadata={
        "help": "rows of x and y (each row is normalised on its own)"})
    cols: int = attrs.field(converter=as_int, validator=positive, metadata={
        "help": "length of each row: the axis the mean of squares runs over"})
    dtype: str = attrs.field(default="fp16", validator=_dtype, metadata={
        "help": f"element dtype of x, w and y: {', '.join(DTYPES)}"})
    eps: float = attrs.field(default=1e-6, converter=float, validator=_eps, metadata={
        "help": "added to the mean of squares before the square root"})

    def input_names(self) -> tuple:
        return ("x", "w")

    def bytes_moved(self) -> float:
        from ck_core.dtypes import ELEMENT_BYTES

        return ELEMENT_BYTES[self.dtype] * (2 * self.rows * self.cols + self.cols)

    def bucket(self) -> tuple:
        """Tuning bucket: the dtype and the row length rounded up to a power of two."""
        return (self.dtype, 1 << (self.cols - 1).bit_length())
