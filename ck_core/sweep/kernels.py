"""The kernel set of a sweep: enumeration, a seed-format config, filters, a cap.

Filters see ``c.<field>`` as the op's :attr:`SweepSpec.filter_fields` gives
them.  ``--filter-file`` takes either a Python file defining
``filter_config(c) -> bool`` (the user's own code, imported explicitly from the
path given, as the tile engine does) or a text file of safe expressions, one
a line.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import attrs

from ..errors import ConfigError, FilterError
from ..fileio import read_json
from ..filters import compile_filter, load_filter_file
from ..registry import Registry
from .matrix import load_toml
from .spec import KernelSet, SweepSpec, generic_kernel_set

log = logging.getLogger(__name__)


def load_config(path) -> dict:
    """A seed-format kernel config (``.json`` or ``.toml``) as a dict."""
    p = Path(path)
    if p.suffix.lower() == ".toml":
        return load_toml(p)
    if p.suffix.lower() != ".json":
        raise ConfigError(f"{p}: unknown config format {p.suffix!r}; use .json or .toml")
    return read_json(p, "kernel config")


def kernel_set_of(spec: SweepSpec, data: dict, source: str) -> KernelSet:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a kernel config is a table/object at top level")
    if spec.kernel_config is not None:
        ks = spec.kernel_config(data, source)
    else:
        ks = generic_kernel_set(data, source)
    if not isinstance(ks, KernelSet):
        raise ConfigError(f"the {spec.op} plugin's kernel_config returned {type(ks).__name__}, not a KernelSet")
    return ks


def python_filter(path) -> Callable:
    """``filter_config`` from the user's Python file, imported from that path only."""
    p = Path(path)
    modspec = importlib.util.spec_from_file_location(f"ck_user_filter_{abs(hash(str(p.resolve())))}", p)
    if modspec is None or modspec.loader is None:
        raise FilterError(f"cannot import filter file {p}")
    mod = importlib.util.module_from_spec(modspec)
    try:
        modspec.loader.exec_module(mod)
    except Exception as exc:  # the user's own code: report, do not crash
        raise FilterError(f"filter file {p} failed to import: {type(exc).__name__}: {exc}") from None
    fn = getattr(mod, "filter_config", None)
    if not callable(fn):
        raise FilterError(f"filter file {p} defines no filter_config(c) function")

    def pred(fields: dict) -> bool:
        try:
            return bool(fn(SimpleNamespace(**fields)))
        except Exception as exc:
            raise FilterError(f"{p}: filter_config failed: {type(exc).__name__}: {exc}") from None
    return pred


def file_filter(path) -> Callable:
    p = Path(path)
    if not p.is_file():
        raise FilterError(f"filter file {p} not found")
    return python_filter(p) if p.suffix == ".py" else load_filter_file(p)


@attrs.frozen
class Selection:
    """The enumerated and filtered kernels, and where they came from."""

    registry: Registry
    arch: str
    enumerated: int


def select_kernels(mgr, spec: SweepSpec, *, arch: Optional[str], backend: str, config: Optional[str] = None,
                   variant: Optional[str] = None, filter_expr: Optional[str] = None,
                   filter_file: Optional[str] = None, max_kernels: int = 0, options: Optional[dict] = None
                   ) -> Selection:
    """Enumerate ``spec.op`` and apply the config, ``--variant``, filters and the cap, in that order."""
    from ..registry import enumerate_keys

    sets = []
    if config:
        sets.append(kernel_set_of(spec, load_config(config), str(config)))
    if variant:
        sets.append(kernel_set_of(spec, {"variant": variant}, f"--variant {variant}"))
    arch = arch or next((s.arch for s in sets if s.arch), None)
    if arch is None:
        raise ConfigError("no arch: pass --arch (or give the config an 'arch' key); `ck archs` lists them")
    opts = dict(options or {})
    for s in sets:
        opts.update(s.options)
    keys = enumerate_keys(spec.op, arch, backend, manager=mgr, **opts)
    enumerated = len(keys)
    for s in sets:
        if s.accept is not None:
            keys = [k for k in keys if s.accept(k)]
    fields = spec.filter_fields or (lambda k: k.fields)
    for pred in ([compile_filter(filter_expr)] if filter_expr else []) + (
            [file_filter(filter_file)] if filter_file else []):
        keys = [k for k in keys if pred(fields(k))]
    if max_kernels and len(keys) > max_kernels:
        log.info("keeping the first %d of %d kernels (--max-kernels)", max_kernels, len(keys))
        keys = keys[:max_kernels]
    return Selection(Registry(arch, keys, name=f"sweep-{spec.op}-{arch}-{backend}", manager=mgr), arch, enumerated)
