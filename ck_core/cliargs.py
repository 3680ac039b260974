"""Typed argparse ``type=`` converters for the ``ck`` command line.

argparse turns an ``ArgumentTypeError`` into a one-line usage error (exit
code 2), so a value such as ``--repeat 0`` or ``--workers -3`` is refused
before any work starts instead of printing ``nan ms`` or being clamped.
"""
from __future__ import annotations

import argparse


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (repeat counts, worker counts, limits)."""
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds)."""
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be >= 0")
    return v
