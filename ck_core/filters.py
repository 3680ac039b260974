"""Safe filter expressions over kernel keys.

``c.hdim_q == 128 and c.pipeline in ("qr", "qr_async")`` is parsed with
:mod:`ast` and evaluated by walking an allow-list of node types.  Names other
than ``c`` (and True/False/None), any call, subscript of a dunder, attribute
starting with ``_``, lambda, comprehension or import are rejected before
anything is evaluated.  No ``eval``/``exec`` is ever used.

The cost of an expression is bounded, so a filter cannot stall ``ck list``:
its text (:data:`MAX_LEN`), nesting depth (:data:`MAX_DEPTH`) and node count
(:data:`MAX_NODES`) are capped; constants are small (:data:`MAX_INT`,
:data:`MAX_STR`); arithmetic takes numbers only (no sequence repetition or
concatenation, no ``%`` formatting) and its results stay within
:data:`MAX_INT`; and each evaluation has a time budget (:data:`TIME_BUDGET`).
"""
from __future__ import annotations

import ast
import math
import operator
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import FilterError

_CMP = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_BIN = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Div: operator.truediv,
}
_CONSTS = {"True": True, "False": False, "None": None}
MAX_LEN = 2000
MAX_DEPTH = 32
MAX_NODES = 400
MAX_INT = 1 << 62
MAX_STR = 256
#: CPU seconds one evaluation on one kernel may take (a legit filter takes microseconds;
#: this thread's CPU time, so a thread paused by a busy machine is not charged)
TIME_BUDGET = 0.25


class Fields:
    """Attribute view of a dict for ``c.<field>`` access in filters."""

    __slots__ = ("_d",)

    def __init__(self, d: Mapping[str, Any]):
        self._d = d

    def get(self, name: str):
        try:
            return self._d[name]
        except KeyError:
            known = ", ".join(sorted(self._d))
            raise FilterError(f"filter uses unknown field c.{name}; fields: {known}") from None


def _depth(node: ast.AST) -> int:
    depth, level = 0, [node]
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return depth
        level = [c for n in level for c in ast.iter_child_nodes(n)]
    return depth


def _check(node: ast.AST, text: str) -> None:
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
               ast.Compare, ast.BinOp, ast.Constant, ast.Name, ast.Load, ast.Attribute,
               ast.Tuple, ast.List, ast.Set, *tuple(_CMP), *tuple(_BIN))
    nodes = list(ast.walk(node))
    if len(nodes) > MAX_NODES:
        raise FilterError(f"filter has {len(nodes)} syntax nodes, more than {MAX_NODES}; split it "
                          f"into several filters (a filter file holds one per line)")
    if _depth(node) > MAX_DEPTH:
        raise FilterError(f"filter is nested more than {MAX_DEPTH} levels deep")
    for sub in nodes:
        if not isinstance(sub, allowed):
            what = type(sub).__name__
            hint = " (calls are not allowed)" if isinstance(sub, ast.Call) else ""
            raise FilterError(f"filter {text!r}: {what} is not allowed{hint}; use comparisons "
                              f"of c.<field> with constants joined by and/or/not")
        if isinstance(sub, ast.Name) and sub.id != "c" and sub.id not in _CONSTS:
            raise FilterError(f"filter {text!r}: unknown name {sub.id!r}; refer to kernel "
                              f"fields as c.<field>")
        if isinstance(sub, ast.Attribute):
            if sub.attr.startswith("_"):
                raise FilterError(f"filter {text!r}: private or dunder attribute "
                                  f"{sub.attr!r} is not allowed")
            if not (isinstance(sub.value, ast.Name) and sub.value.id == "c"):
                raise FilterError(f"filter {text!r}: only c.<field> attributes are allowed")
        if isinstance(sub, ast.Constant):
            _check_value(sub.value, "constant")


def _check_value(v, what: str):
    """``v`` when it is small enough to be a filter value, else FilterError."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        if abs(v) > MAX_INT:
            raise FilterError(f"filter {what} {str(v)[:20]}... is larger than {MAX_INT}")
    elif isinstance(v, float):
        if not math.isfinite(v) or abs(v) > MAX_INT:
            raise FilterError(f"filter {what} {v!r} is not a finite number below {MAX_INT}")
    elif isinstance(v, str):
        if len(v) > MAX_STR:
            raise FilterError(f"filter {what} {v[:20]!r}... is longer than {MAX_STR} characters")
    elif isinstance(v, (tuple, list)):
        pass
    else:
        raise FilterError(f"filter {what} of type {type(v).__name__} is not allowed "
                          f"(numbers, strings, True/False/None)")
    return v


def _arith(op: ast.operator, left, right):
    """Arithmetic on numbers only: ``'x' * 10**8`` or ``'%999999d' % 1`` never run."""
    for v in (left, right):
        if not isinstance(v, (int, float)):   # bools are ints: c.pad_m + c.pad_n is fine
            raise FilterError(f"filter arithmetic ({type(op).__name__}) takes numbers, not "
                              f"{type(v).__name__}; compare strings with == or in")
    try:
        return _check_value(_BIN[type(op)](left, right), "result")
    except (ZeroDivisionError, OverflowError) as exc:
        raise FilterError(f"filter arithmetic failed: {exc}") from None


class _Overrun(FilterError):
    pass


class _Budget:
    __slots__ = ("deadline",)

    def __init__(self, seconds: float):
        self.deadline = time.thread_time() + seconds

    def tick(self):
        if time.thread_time() > self.deadline:
            raise _Overrun(f"filter evaluation took longer than its budget of {TIME_BUDGET * 1e3:.0f} ms "
                              f"on one kernel; simplify it")


def _eval(node: ast.AST, c: Fields, b: _Budget):
    b.tick()
    if isinstance(node, ast.Expression):
        return _eval(node.body, c, b)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, c, b) for v in node.values)
        return any(_eval(v, c, b) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        val = _eval(node.operand, c, b)
        if isinstance(node.op, ast.Not):
            return not val
        return _arith(ast.Sub(), 0, val)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, c, b)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, c, b)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp):
        return _arith(node.op, _eval(node.left, c, b), _eval(node.right, c, b))
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return c if node.id == "c" else _CONSTS[node.id]
    if isinstance(node, ast.Attribute):
        return c.get(node.attr)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return tuple(_eval(e, c, b) for e in node.elts)
    raise FilterError(f"unsupported node {type(node).__name__}")  # unreachable after _check


def compile_filter(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """Parse and vet ``text``; return ``pred(fields_dict) -> bool``."""
    if not isinstance(text, str) or not text.strip():
        raise FilterError("empty filter expression; write e.g. c.tile_m == 128")
    if len(text) > MAX_LEN:
        raise FilterError(f"filter expression longer than {MAX_LEN} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (RecursionError, MemoryError):
        raise FilterError(f"filter is nested more than {MAX_DEPTH} levels deep") from None
    except SyntaxError as exc:
        raise FilterError(f"filter {text!r} does not parse: {exc.msg} at column {exc.offset}") from None
    _check(tree, text)

    def pred(fields: Mapping[str, Any]) -> bool:
        try:
            try:
                return bool(_eval(tree, Fields(fields), _Budget(TIME_BUDGET)))
            except _Overrun:
                # a garbage-collection pause inside one evaluation is charged to it too: a filter
                # is pure, so evaluate once more and refuse only a second overrun
                return bool(_eval(tree, Fields(fields), _Budget(TIME_BUDGET)))
        except FilterError:
            raise
        except Exception as exc:  # e.g. comparing str < int
            raise FilterError(f"filter {text!r} failed on a kernel: {exc}") from None

    return pred


def load_filter_file(path) -> Callable[[Mapping[str, Any]], bool]:
    """A filter file holds one expression per line ('#' comments); all must hold."""
    from .fileio import read_text

    p = Path(path)
    lines = read_text(p, "filter file", "filter", FilterError).splitlines()
    preds = []
    for i, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            preds.append(compile_filter(line))
        except FilterError as exc:
            raise FilterError(f"{p}:{i}: {exc}") from None
    if not preds:
        raise FilterError(f"filter file {p} holds no expression")

    def run(fields):
        for i, pr in enumerate(preds):
            try:
                if not pr(fields):
                    return False
            except FilterError as exc:  # an evaluation error names the file it came from
                raise FilterError(f"{p}: {exc}") from None
        return True
    return run
