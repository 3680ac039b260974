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

import sys
from pathlib import Path
from typing import Any

import attrs

from . import fileio
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
MAX_BYTES = fileio.LIMITS["config"]
#: deeper nesting than any real config has; bounds the recursion of parsers and readers
MAX_DEPTH = 32


def read_text(path, what: str = "config file") -> str:
    """The UTF-8 text of a small regular file; ConfigError naming the file for anything else."""
    return fileio.read_text(path, what, MAX_BYTES)


def _check_depth(data, p: Path) -> None:
    why = fileio.depth_error(data, MAX_DEPTH)
    if why:
        raise ConfigError(f"{p} {why}")


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
    return fileio.read_json(path, "config file", MAX_BYTES, max_depth=MAX_DEPTH)


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
