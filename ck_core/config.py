"""TOML configuration for kernel sets (tomllib, falling back to tomli).

A kernel-set file::

    [[kernel_set]]
    name = "fp16-gemms"
    op = "gemm"
    arch = "gfx942"
    backend = "numpy"          # optional
    filter = "c.dtype == 'fp16' and c.tile_m >= 128"   # optional
    [kernel_set.options]       # optional, passed to the op's enumeration
    dtypes = ["fp16"]

Errors name the file and the key.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@attrs.frozen
class KernelSet:
    name: str
    op: str
    arch: str
    backend: str = "numpy"
    filter: str = ""
    options: dict = attrs.field(factory=dict)
    source: str = ""

    def registry(self, manager=None):
        from .registry import Registry

        return Registry.from_enumeration(self.op, self.arch, self.backend,
                                         filter=self.filter or None, manager=manager, **self.options)


#: a config is a page of settings: anything larger is a mistake (or /dev/zero), not a config
MAX_BYTES = 4 << 20
#: deeper nesting than any real config has; bounds the recursion of parsers and readers
MAX_DEPTH = 32


def read_text(path, what: str = "config file") -> str:
    """The UTF-8 text of a small file; ConfigError naming the file for anything else."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{what} {p} is larger than {MAX_BYTES >> 20} MiB; is it the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {p} is not UTF-8 text (byte {exc.start}); is it a binary file?") from None
    if "\x00" in text:
        raise ConfigError(f"{what} {p} holds NUL bytes; is it a binary file?")
    return text


def _check_depth(data, p: Path) -> None:
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"{p} nests tables/arrays deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def load_toml(path) -> dict:
    p = Path(path)
    text = read_text(p)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p} nests tables/arrays too deeply to parse") from None
    _check_depth(data, p)
    return data


def load_json(path):
    p = Path(path)
    text = read_text(p)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p} nests objects/arrays too deeply to parse") from None
    _check_depth(data, p)
    return data


_TYPES = {"name": str, "op": str, "arch": str, "backend": str, "filter": str, "options": dict}


def load_kernel_sets(path) -> list[KernelSet]:
    data = load_toml(path)
    sets = data.get("kernel_set")
    if not isinstance(sets, list) or not sets:
        raise ConfigError(f"{path}: expected one or more [[kernel_set]] tables")
    out = []
    for i, raw in enumerate(sets):
        where = f"{path}: kernel_set[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a [[kernel_set]] table, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(_TYPES))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(_TYPES)}")
        for req in ("op", "arch"):
            if req not in raw:
                raise ConfigError(f"{where}: missing key {req!r}")
        for k, typ in _TYPES.items():
            if k in raw and not isinstance(raw[k], typ):
                raise ConfigError(f"{where}.{k}: expected {typ.__name__}, got {type(raw[k]).__name__}")
        if raw.get("filter"):
            from .filters import compile_filter
            try:
                compile_filter(raw["filter"])
            except ConfigError as exc:
                raise ConfigError(f"{where}.filter: {exc}") from None
        vals: dict[str, Any] = dict(raw)
        vals.setdefault("name", f"set{i}")
        out.append(KernelSet(source=str(path), **vals))
    return out
