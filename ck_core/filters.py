"""Safe filter expressions over kernel keys.

``c.hdim_q == 128 and c.pipeline in ("qr", "qr_async")`` is parsed with
:mod:`ast` and evaluated by walking an allow-list of node types.  Names other
than ``c`` (and True/False/None), any call, subscript of a dunder, attribute
starting with ``_``, lambda, comprehension or import are rejected before
anything is evaluated.  No ``eval``/``exec`` is ever used.
"""
from __future__ import annotations

import ast
import operator
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
_MAX_LEN = 2000


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


def _check(node: ast.AST, text: str) -> None:
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
               ast.Compare, ast.BinOp, ast.Constant, ast.Name, ast.Load, ast.Attribute,
               ast.Tuple, ast.List, ast.Set, *tuple(_CMP), *tuple(_BIN))
    for sub in ast.walk(node):
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


def _eval(node: ast.AST, c: Fields):
    if isinstance(node, ast.Expression):
        return _eval(node.body, c)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, c) for v in node.values)
        return any(_eval(v, c) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        val = _eval(node.operand, c)
        return (not val) if isinstance(node.op, ast.Not) else -val
    if isinstance(node, ast.Compare):
        left = _eval(node.left, c)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, c)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_eval(node.left, c), _eval(node.right, c))
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return c if node.id == "c" else _CONSTS[node.id]
    if isinstance(node, ast.Attribute):
        return c.get(node.attr)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return tuple(_eval(e, c) for e in node.elts)
    raise FilterError(f"unsupported node {type(node).__name__}")  # unreachable after _check


def compile_filter(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """Parse and vet ``text``; return ``pred(fields_dict) -> bool``."""
    if not isinstance(text, str) or not text.strip():
        raise FilterError("empty filter expression; write e.g. c.tile_m == 128")
    if len(text) > _MAX_LEN:
        raise FilterError(f"filter expression longer than {_MAX_LEN} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise FilterError(f"filter {text!r} does not parse: {exc.msg} at column {exc.offset}") from None
    _check(tree, text)

    def pred(fields: Mapping[str, Any]) -> bool:
        try:
            return bool(_eval(tree, Fields(fields)))
        except FilterError:
            raise
        except Exception as exc:  # e.g. comparing str < int
            raise FilterError(f"filter {text!r} failed on a kernel: {exc}") from None

    return pred


def load_filter_file(path) -> Callable[[Mapping[str, Any]], bool]:
    """A filter file holds one expression per line ('#' comments); all must hold."""
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise FilterError(f"cannot read filter file {p}: {exc.strerror}") from None
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
    return lambda fields: all(pr(fields) for pr in preds)
