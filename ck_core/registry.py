"""Registry: an ordered set of kernel keys for one arch.

Several registries live side by side (one per arch, or per purpose); they
filter, merge, export to and import from JSON, and build through a backend.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

from .errors import ConfigError, MissingKernel
from .filters import compile_filter
from .key import KernelKey
from .plugins import PluginManager, get_manager

log = logging.getLogger(__name__)

FORMAT = "ck-dispatcher.registry/1"


def enumerate_keys(op: str, arch: str, backend: str = "numpy", manager: Optional[PluginManager] = None,
                   **options) -> list[KernelKey]:
    """Every legal kernel key of ``op`` for ``arch`` and ``backend``.

    Candidates come from the op plugin and the ``ck_extra_kernels`` hook; the
    arch's rules and the ``ck_reject_kernel`` hook cull them, and each culled
    key is logged at debug level with its reason.
    """
    mgr = manager or get_manager()
    opspec, archspec = mgr.op(op), mgr.arch(arch)
    keys = list(opspec.enumerate(archspec, backend, dict(options)))
    for extra in mgr.hook.ck_extra_kernels(op=opspec, arch=archspec, backend=backend, options=options):
        keys.extend(extra or ())
    has_hook_rules = bool(mgr.hook.ck_reject_kernel.get_hookimpls())
    out, seen = [], set()
    debug = log.isEnabledFor(logging.DEBUG)
    for key in keys:
        if key in seen:
            continue
        seen.add(key)
        reason = archspec.reject(key)
        if reason is None and has_hook_rules:
            reasons = [r for r in mgr.hook.ck_reject_kernel(key=key, arch=archspec) if r]
            reason = reasons[0] if reasons else None
        if reason:
            if debug:
                log.debug("culled %s: %s", key.name, reason)
            continue
        out.append(key)
    return out


class Registry:
    def __init__(self, arch: str, keys: Iterable[KernelKey] = (), name: str = "",
                 manager: Optional[PluginManager] = None):
        self.arch = arch
        self.name = name or f"registry-{arch}"
        self.manager = manager
        self._keys: dict[KernelKey, None] = {}
        self._by_name: Optional[dict[str, KernelKey]] = None
        self.build_info: dict[str, dict] = {}
        for k in keys:
            self.add(k)

    @property
    def mgr(self) -> PluginManager:
        return self.manager or get_manager()

    @classmethod
    def from_enumeration(cls, op: str, arch: str, backend: str = "numpy", filter=None,
                         manager: Optional[PluginManager] = None, **options) -> "Registry":
        reg = cls(arch, enumerate_keys(op, arch, backend, manager=manager, **options),
                  name=f"{op}-{arch}-{backend}", manager=manager)
        return reg.filter(filter) if filter else reg

    # -- set operations ---------------------------------------------------
    def add(self, key: KernelKey) -> None:
        if not isinstance(key, KernelKey):
            raise TypeError(f"Registry.add takes a KernelKey, got {type(key).__name__}")
        if key.arch != self.arch:
            raise ConfigError(f"kernel {key.name} is for arch {key.arch}, but registry "
                              f"{self.name!r} holds arch {self.arch}; use one registry per arch")
        self._keys[key] = None
        self._by_name = None

    def extend(self, keys: Iterable[KernelKey]) -> None:
        for k in keys:
            self.add(k)

    def remove(self, key: KernelKey) -> None:
        self._keys.pop(key, None)
        self._by_name = None

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[KernelKey]:
        return iter(list(self._keys))

    def __contains__(self, key) -> bool:
        if isinstance(key, str):
            return key in self._names()
        return key in self._keys

    def keys(self) -> list[KernelKey]:
        return list(self._keys)

    def _names(self) -> dict[str, KernelKey]:
        if self._by_name is None:
            self._by_name = {k.name: k for k in self._keys}
        return self._by_name

    def get(self, name: str) -> KernelKey:
        try:
            return self._names()[name]
        except KeyError:
            raise MissingKernel(f"registry {self.name!r} has no kernel {name!r}; "
                                f"`ck list` shows what exists") from None

    def filter(self, expr: Union[str, Callable[[dict], bool]]) -> "Registry":
        pred = compile_filter(expr) if isinstance(expr, str) else expr
        return Registry(self.arch, (k for k in self._keys if pred(k.fields)),
                        name=self.name, manager=self.manager)

    def merge(self, other: "Registry") -> "Registry":
        if other.arch != self.arch:
            raise ConfigError(f"cannot merge registries of arch {self.arch} and {other.arch}")
        merged = Registry(self.arch, self._keys, name=self.name, manager=self.manager)
        merged.extend(other)
        return merged

    def candidates(self, problem, backend: Optional[str] = None) -> list[KernelKey]:
        """Keys (in registry order) whose kernels compute ``problem``."""
        out = []
        ops = self.mgr.ops()
        for key in self._keys:
            if key.op != problem.op or (backend and key.backend != backend):
                continue
            if ops[key.op].supports(key, problem) is None:
                out.append(key)
        return out

    def why_not(self, problem, limit: int = 5) -> list[str]:
        """Reasons the first few keys do not support ``problem`` (for error messages)."""
        ops = self.mgr.ops()
        reasons = []
        for key in self._keys:
            if key.op != problem.op:
                continue
            reason = ops[key.op].supports(key, problem)
            if reason:
                reasons.append(f"{key.name}: {reason}")
            if len(reasons) >= limit:
                break
        return reasons

    # -- JSON --------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "name": self.name, "arch": self.arch,
                "kernels": [k.to_dict() for k in self._keys]}

    def export_json(self, path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p

    @classmethod
    def from_dict(cls, data: dict, manager: Optional[PluginManager] = None) -> "Registry":
        if data.get("format") != FORMAT:
            raise ConfigError(f"not a registry file (format {data.get('format')!r}, expected {FORMAT!r})")
        reg = cls(data["arch"], name=data.get("name", ""), manager=manager)
        for rec in data["kernels"]:
            reg.add(KernelKey.from_dict(rec, manager=manager))
        return reg

    @classmethod
    def import_json(cls, path, manager: Optional[PluginManager] = None) -> "Registry":
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read registry file {p}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p} is not valid JSON: {exc}") from None
        return cls.from_dict(data, manager=manager)

    # -- build ---------------------------------------------------------------
    def build(self, max_workers: Optional[int] = None, progress: Optional[bool] = None,
              force: bool = False):
        """Compile every kernel through its backend; failures are reported, removed, never fatal."""
        from .build import build_registry

        return build_registry(self, max_workers=max_workers, progress=progress, force=force)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, arch={self.arch!r}, kernels={len(self)})"
