"""Testing matrices: the shapes a sweep runs, in TOML, by category.

A matrix file holds ``[[shape]]`` tables::

    [[shape]]
    name = "llama3_8b.qkv"          # unique after expansion
    category = "smoke"              # smoke | full | nightly
    n = 6144
    k = 4096
    [shape.expand]                  # optional: the cross product of these lists
    m = [1, 16, 128]
    dtype = ["fp16", "bf16"]

Every other key is a problem field (a list stays a list, e.g. a conv's
``input_spatial``).  Expanded names get ``.<field><value>`` suffixes; an
``expand`` list of tables sets several fields together
(``ch = [{ G = 32, C = 32, K = 32 }, ...]``).
Categories nest: ``smoke`` is part of ``full``, and both of ``nightly``.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterable, List, Mapping, Optional

import attrs

from ..errors import ConfigError
from ..fileio import depth_error, read_text

CATEGORIES = ("smoke", "full", "nightly")
_INCLUDES = {"smoke": {"smoke"}, "full": {"smoke", "full"}, "nightly": set(CATEGORIES)}


@attrs.frozen
class Shape:
    """One row of a testing matrix: a unique name, its category and the problem fields."""

    name: str
    category: str
    fields: Mapping[str, Any]

    def to_dict(self) -> dict:
        return {"name": self.name, "category": self.category, "fields": dict(self.fields)}


def load_toml(path: Path, what: str = "TOML file") -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python < 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError(f"{path}: reading TOML needs Python 3.11+ or the 'tomli' package") from None
    text = read_text(path, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path} nests tables/arrays too deeply to parse") from None
    why = depth_error(data)
    if why:
        raise ConfigError(f"{path} {why}")
    return data


def _token(value) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(map(str, value))
    return str(value)


def _expand(entry: dict, where: str) -> Iterable[tuple[str, dict]]:
    fields = {k: v for k, v in entry.items() if k not in ("name", "category", "expand")}
    grid = entry.get("expand") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"{where}: 'expand' must be a table of non-empty lists")
    clash = set(grid) & set(fields)
    if clash:
        raise ConfigError(f"{where}: {sorted(clash)} given both as a field and under 'expand'")
    names = list(grid)
    for combo in itertools.product(*(grid[n] for n in names)):
        row, suffix = dict(fields), ""
        for n, v in zip(names, combo):
            if isinstance(v, dict):  # a table sets several fields together (e.g. G = C = K)
                row.update(v)
                suffix += "." + "".join(f"{k}{_token(x)}" for k, x in v.items())
            else:
                row[n] = v
                suffix += f".{n}{_token(v)}"
        yield entry["name"] + suffix, row


def parse_matrix(data: Mapping[str, Any], source: str) -> List[Shape]:
    rows = data.get("shape")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{source}: a testing matrix holds [[shape]] tables; none found")
    out, seen = [], {}
    for i, entry in enumerate(rows):
        where = f"{source}: shape[{i}]"
        if not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ConfigError(f"{where}: every shape needs a 'name'")
        cat = entry.get("category", "full")
        if cat not in CATEGORIES:
            raise ConfigError(f"{where} ({entry['name']}): category {cat!r}; use one of {', '.join(CATEGORIES)}")
        for name, fields in _expand(entry, f"{where} ({entry['name']})"):
            if name in seen:
                raise ConfigError(f"{source}: shape name {name!r} appears twice (shape[{seen[name]}] and "
                                  f"shape[{i}]); names key the output rows, make them unique")
            seen[name] = i
            out.append(Shape(name, cat, fields))
    return out


def load_matrix(path, category: Optional[str] = None) -> List[Shape]:
    """The shapes of ``path`` in ``category`` (None: every shape)."""
    p = Path(path)
    shapes = parse_matrix(load_toml(p, "testing matrix"), str(p))
    if category is None:
        return shapes
    if category not in _INCLUDES:
        raise ConfigError(f"unknown category {category!r}; use one of {', '.join(CATEGORIES)}")
    return [s for s in shapes if s.category in _INCLUDES[category]]
