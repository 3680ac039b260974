"""Plugin discovery: entry points, allow/block lists, typed registration.

Groups: ``ck_core.ops``, ``ck_core.archs``, ``ck_core.backends``.  Each entry
point names a module whose ``ck_*`` functions are hook implementations.
Knobs: ``CK_DISABLE_PLUGIN_AUTOLOAD``, ``CK_PLUGINS`` (allow-list),
``CK_BLOCK_PLUGINS`` (block-list) -- see :mod:`ck_core.knobs`.
"""
from __future__ import annotations

import importlib
import logging
from importlib import metadata
from typing import Iterable, Optional

import pluggy

from . import hookspecs, knobs
from .errors import PluginError
from .records import ArchSpec, BackendSpec, OpSpec, check_records

log = logging.getLogger(__name__)

GROUPS = ("ck_core.ops", "ck_core.archs", "ck_core.backends")
#: modules that ship with ck-core; they load even when autoload is disabled
BUILTINS = {"numpy": "ck_core.backends.numpy_backend",
            "triton": "ck_core.backends.triton_backend",
            "ck": "ck_core.backends.ck_backend"}


class PluginManager:
    """Loads plugins once and answers which ops, archs and backends exist."""

    def __init__(self, plugins: Iterable = (), autoload: Optional[bool] = None):
        self.pm = pluggy.PluginManager("ck_core")
        self.pm.add_hookspecs(hookspecs)
        self._dist: dict[int, str] = {}
        self.loaded: list[dict] = []
        if autoload is None:
            autoload = not knobs.get("CK_DISABLE_PLUGIN_AUTOLOAD")
        allow = set(knobs.get("CK_PLUGINS"))
        block = set(knobs.get("CK_BLOCK_PLUGINS"))
        seen_modules: set[str] = set()
        for name, module in BUILTINS.items():
            if name in block:
                continue
            self._load_module(name, module, "ck-core", "builtin")
            seen_modules.add(module)
        if autoload:
            for group in GROUPS:
                for ep in _entry_points(group):
                    if ep.value in seen_modules:
                        continue
                    if ep.name in block or (allow and ep.name not in allow):
                        log.debug("plugin %s skipped by allow/block list", ep.name)
                        continue
                    dist = ep.dist.name if getattr(ep, "dist", None) else "?"
                    try:
                        obj = ep.load()
                    except Exception as exc:  # a broken plugin must say who it is
                        raise PluginError(
                            f"plugin {ep.name!r} from distribution {dist!r} failed to import "
                            f"({ep.value}): {exc}. Reinstall it, or block it with "
                            f"CK_BLOCK_PLUGINS={ep.name}"
                        ) from exc
                    seen_modules.add(ep.value)
                    self._register(ep.name, obj, dist, group)
        for obj in plugins:
            self._register(getattr(obj, "__name__", repr(obj)), obj, "<explicit>", "explicit")
        self._ops = self._collect(self.pm.hook.ck_register_ops, OpSpec, "op")
        self._archs = self._collect(self.pm.hook.ck_register_archs, ArchSpec, "arch")
        self._backends = self._collect(self.pm.hook.ck_register_backends, BackendSpec, "backend")
        self._knobs: Optional[dict] = None

    # -- loading ---------------------------------------------------------
    def _load_module(self, name, module, dist, group):
        self._register(name, importlib.import_module(module), dist, group)

    def _register(self, name, obj, dist, group):
        if self.pm.is_registered(obj):
            return
        self.pm.register(obj, name=f"{group}:{name}")
        self._dist[id(obj)] = dist
        self.loaded.append({"name": name, "group": group, "distribution": dist,
                            "module": getattr(obj, "__name__", repr(obj))})

    def _collect(self, hook, kind, what):
        found: dict[str, object] = {}
        for impl in reversed(hook.get_hookimpls()):
            dist = self._dist.get(id(impl.plugin), "?")
            try:
                result = impl.function()
            except Exception as exc:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} (distribution {dist!r}) failed in "
                    f"{hook.name}: {exc}"
                ) from exc
            for rec in check_records(result, kind, impl.plugin_name):
                if rec.name in found:
                    other = found[rec.name]
                    raise PluginError(
                        f"two plugins register the {what} {rec.name!r}: distribution "
                        f"{other.distribution!r} and distribution {dist!r}; uninstall one "
                        f"or block one with CK_BLOCK_PLUGINS"
                    )
                if not rec.distribution:
                    rec = _with_dist(rec, dist)
                found[rec.name] = rec
        return found

    # -- queries ---------------------------------------------------------
    @property
    def hook(self):
        return self.pm.hook

    def ops(self) -> dict[str, OpSpec]:
        return dict(self._ops)

    def archs(self) -> dict[str, ArchSpec]:
        return dict(self._archs)

    def backends(self) -> dict[str, BackendSpec]:
        return dict(self._backends)

    def op(self, name: str) -> OpSpec:
        return _lookup(self._ops, name, "op", "pip install ck-" + name)

    def arch(self, name: str) -> ArchSpec:
        return _lookup(self._archs, name, "arch", "pip install ck-arch-" + name)

    def backend(self, name: str) -> BackendSpec:
        return _lookup(self._backends, name, "backend", "check `ck plugins`")

    def knobs(self) -> dict:
        """The knobs plugins declare (``ck_declare_knobs``), collected on first use."""
        if self._knobs is None:
            found: dict = {}
            for impl in reversed(self.pm.hook.ck_declare_knobs.get_hookimpls()):
                for knob in impl.function() or ():
                    if not isinstance(knob, knobs.Knob):
                        raise PluginError(f"plugin {impl.plugin_name!r} declared {knob!r} in "
                                          f"ck_declare_knobs; build it with ck_core.knobs.Knob(...)")
                    if knob.name in knobs.KNOBS or knob.name in found:
                        raise PluginError(f"plugin {impl.plugin_name!r} declares the knob {knob.name}, "
                                          f"which the core or another plugin already declares; rename it")
                    found[knob.name] = knob
            self._knobs = found
        return dict(self._knobs)

    def op_for_name(self, kernel_name: str) -> OpSpec:
        """The op whose names start like ``kernel_name`` (``gemm_...`` -> gemm)."""
        for op in sorted(self._ops.values(), key=lambda o: -len(o.name)):
            if kernel_name.startswith((op.name + "_", op.name + ".")):
                return op
        raise PluginError(
            f"no installed op plugin makes kernels named like {kernel_name[:40]!r}; "
            f"installed ops: {', '.join(sorted(self._ops)) or 'none'}"
        )


def _with_dist(rec, dist):
    import attrs

    return attrs.evolve(rec, distribution=dist)


def _lookup(table, name, what, hint):
    try:
        return table[name]
    except KeyError:
        known = ", ".join(sorted(table)) or "none"
        raise PluginError(f"unknown {what} {name!r}; installed: {known} (to add one: {hint})") from None


def _entry_points(group: str):
    try:
        return list(metadata.entry_points(group=group))
    except TypeError:  # pragma: no cover - Python < 3.10 API
        return list(metadata.entry_points().get(group, []))


_MANAGER: Optional[PluginManager] = None


def get_manager() -> PluginManager:
    """The process-wide plugin manager (created on first use)."""
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = PluginManager()
    return _MANAGER


def reset_manager(manager: Optional[PluginManager] = None) -> None:
    """Forget the process-wide manager (tests; after installing a plugin)."""
    global _MANAGER
    _MANAGER = manager


def _declared_knobs() -> dict:
    return get_manager().knobs()


# the knobs module sits below this one: it learns of the plugins' knobs through this source
knobs.add_source(_declared_knobs)
