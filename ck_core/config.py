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


def load_toml(path) -> dict:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}") from None


_TYPES = {"name": str, "op": str, "arch": str, "backend": str, "filter": str, "options": dict}


def load_kernel_sets(path) -> list[KernelSet]:
    data = load_toml(path)
    sets = data.get("kernel_set")
    if not isinstance(sets, list) or not sets:
        raise ConfigError(f"{path}: expected one or more [[kernel_set]] tables")
    out = []
    for i, raw in enumerate(sets):
        where = f"{path}: kernel_set[{i}]"
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
