"""Registry: an ordered set of kernel keys for one arch.

Several registries live side by side (one per arch, or per purpose); they
filter, merge, export to and import from JSON, and build through a backend.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

from . import fileio
from .errors import CkError, ConfigError, MissingKernel, PluginError
from .filters import compile_filter
from .key import KernelKey, check_name
from .keyspace import FilteredSpace, KeySpace
from .plugins import PluginManager, get_manager

log = logging.getLogger(__name__)

FORMAT = "ck-dispatcher.registry/1"
_FILE_FIELDS = frozenset({"format", "name", "arch", "kernels"})
#: registry files larger than this are refused before parsing (a registry of every
#: FMHA kernel of an arch is about 40 MB)
MAX_FILE_BYTES = 512 << 20


def rejection(key: KernelKey, archspec, mgr: PluginManager, op_rules: bool = True,
              hook_rules: Optional[bool] = None) -> Optional[str]:
    """Why ``key`` is illegal on ``archspec`` (arch rules, ``ck_reject_kernel``, and with
    ``op_rules`` the op's own enumeration rules), or None."""
    if hook_rules is None:
        hook_rules = bool(mgr.hook.ck_reject_kernel.get_hookimpls())
    reason = archspec.reject(key)
    if reason is None and hook_rules:
        reasons = [r for r in mgr.hook.ck_reject_kernel(key=key, arch=archspec) if r]
        reason = reasons[0] if reasons else None
    if reason is None and op_rules:
        legal = mgr.op(key.op).legal
        reason = legal(key, archspec) if legal is not None else None
    return reason


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
    hook_rules = bool(mgr.hook.ck_reject_kernel.get_hookimpls())
    out, seen = [], set()
    debug = log.isEnabledFor(logging.DEBUG)
    for key in keys:
        if key in seen:
            continue
        seen.add(key)
        reason = rejection(key, archspec, mgr, op_rules=False, hook_rules=hook_rules)
        if reason:
            if debug:
                log.debug("culled %s: %s", key.name, reason)
            continue
        out.append(key)
    return out


class Registry:
    """Kernel keys of one arch: KeySpaces (compact, expanded on demand) plus single keys.

    An enumeration with an ``OpSpec.key_space`` stays a space: ``len``, membership and
    a problem's candidates cost what the space needs for them, not a full expansion.
    Iteration, JSON export and builds expand it.
    """

    def __init__(self, arch: str, keys: Iterable[KernelKey] = (), name: str = "",
                 manager: Optional[PluginManager] = None, spaces: Iterable[KeySpace] = ()):
        self.arch = arch
        self.name = name or f"registry-{arch}"
        self.manager = manager
        self._keys: dict[KernelKey, None] = {}
        self._spaces: list[KeySpace] = []
        #: keys of the spaces taken out with :meth:`remove`
        self._removed: set = set()
        self._by_name: Optional[dict[str, KernelKey]] = None
        #: (op, backend) -> the listed keys of that op and backend, in registry order (see candidates)
        self._plain: dict = {}
        self.build_info: dict[str, dict] = {}
        for s in spaces:
            self.add_space(s)
        for k in keys:
            self.add(k)

    @property
    def mgr(self) -> PluginManager:
        return self.manager or get_manager()

    @classmethod
    def from_enumeration(cls, op: str, arch: str, backend: str = "numpy", filter=None,
                         manager: Optional[PluginManager] = None, **options) -> "Registry":
        mgr = manager or get_manager()
        opspec, archspec = mgr.op(op), mgr.arch(arch)
        name = f"{op}-{arch}-{backend}"
        if opspec.key_space is None:
            reg = cls(arch, enumerate_keys(op, arch, backend, manager=mgr, **options), name=name,
                      manager=manager)
        else:
            space = opspec.key_space(archspec, backend, dict(options))
            if archspec.rules_for(op) or mgr.hook.ck_reject_kernel.get_hookimpls():
                space = FilteredSpace(space, lambda k: rejection(k, archspec, mgr, op_rules=False) is None)
            reg = cls(arch, name=name, manager=manager, spaces=[space])
            extra = [k for ks in mgr.hook.ck_extra_kernels(op=opspec, arch=archspec, backend=backend,
                                                           options=options) for k in (ks or ())]
            reg.extend(k for k in extra if rejection(k, archspec, mgr, op_rules=False) is None)
        return reg.filter(filter) if filter else reg

    # -- set operations ---------------------------------------------------
    def add_space(self, space: KeySpace) -> None:
        if space.arch != self.arch:
            raise ConfigError(f"a key space of arch {space.arch} cannot join registry {self.name!r} "
                              f"of arch {self.arch}; use one registry per arch")
        self._spaces.append(space)
        self._by_name = None
        self._plain.clear()

    def _in_spaces(self, key) -> bool:
        for s in self._spaces:   # a loop, not any(): selection asks per shortlisted key
            if key in s:
                return True
        return False

    def add(self, key: KernelKey) -> None:
        if not isinstance(key, KernelKey):
            raise TypeError(f"Registry.add takes a KernelKey, got {type(key).__name__}")
        if key.arch != self.arch:
            raise ConfigError(f"kernel {key.name} is for arch {key.arch}, but registry "
                              f"{self.name!r} holds arch {self.arch}; use one registry per arch")
        if self._spaces and self._in_spaces(key):
            self._removed.discard(key)
            return
        self._keys[key] = None
        self._by_name = None
        self._plain.clear()

    def extend(self, keys: Iterable[KernelKey]) -> None:
        for k in keys:
            self.add(k)

    def remove(self, key: KernelKey) -> None:
        self._keys.pop(key, None)
        if self._spaces and self._in_spaces(key):
            self._removed.add(key)
        self._by_name = None
        self._plain.clear()

    def __len__(self) -> int:
        if len(self._spaces) > 1:   # spaces may overlap: count what iteration yields
            return sum(1 for _ in self)
        removed = sum(1 for k in self._removed if self._in_spaces(k))
        return sum(s.count() for s in self._spaces) - removed + len(self._keys)

    def __iter__(self) -> Iterator[KernelKey]:
        if not self._spaces:
            return iter(list(self._keys))
        return self._iter()

    def _iter(self):
        removed, seen = self._removed, set()
        for s in self._spaces:
            for k in s:
                if k not in removed and k not in seen:
                    if len(self._spaces) > 1:
                        seen.add(k)
                    yield k
        yield from list(self._keys)

    def __contains__(self, key) -> bool:
        if isinstance(key, str):
            return self._lookup(key) is not None
        return key in self._keys or (key not in self._removed and self._in_spaces(key))

    def keys(self) -> list[KernelKey]:
        return list(self)

    def _names(self) -> dict[str, KernelKey]:
        if self._by_name is None:
            self._by_name = {k.name: k for k in self._keys}
        return self._by_name

    def _lookup(self, name: str) -> Optional[KernelKey]:
        key = self._names().get(name)
        if key is None and self._spaces:
            try:
                key = KernelKey.from_name(name, manager=self.mgr)
            except CkError:
                return None
            if key.arch != self.arch or key in self._removed or not self._in_spaces(key):
                return None
        return key

    def get(self, name: str) -> KernelKey:
        key = self._lookup(name)
        if key is None:
            raise MissingKernel(f"registry {self.name!r} has no kernel {name!r}; "
                                f"`ck list` shows what exists")
        return key

    def filter(self, expr: Union[str, Callable[[dict], bool]]) -> "Registry":
        pred = compile_filter(expr) if isinstance(expr, str) else expr
        reg = Registry(self.arch, (k for k in self._keys if pred(k.fields)), name=self.name,
                       manager=self.manager,
                       spaces=[FilteredSpace(s, lambda k: pred(k.fields)) for s in self._spaces])
        reg._removed = set(self._removed)
        return reg

    def merge(self, other: "Registry") -> "Registry":
        if other.arch != self.arch:
            raise ConfigError(f"cannot merge registries of arch {self.arch} and {other.arch}")
        merged = Registry(self.arch, self._keys, name=self.name, manager=self.manager,
                          spaces=self._spaces + [FilteredSpace(s, lambda k, r=other._removed: k not in r)
                                                 for s in other._spaces])
        merged._removed = set(self._removed)
        merged.extend(other._keys)
        return merged

    def candidates(self, problem, backend: Optional[str] = None) -> list[KernelKey]:
        """Keys (in registry order) whose kernels compute ``problem``."""
        out = []
        ops = self.mgr.ops()
        if self._spaces:
            op = ops.get(problem.op)
            seen: set = set()
            for s in self._spaces:
                if op is None or s.op != problem.op or (backend and s.backend != backend):
                    continue
                for k in s.candidates(problem, op.supports):
                    if k not in self._removed and k not in seen:
                        seen.add(k)
                        out.append(k)
        keys = self._plain.get((problem.op, backend))
        if keys is None:
            keys = self._plain[(problem.op, backend)] = tuple(
                k for k in self._keys if k.op == problem.op and not (backend and k.backend != backend))
        if keys:
            op = ops[problem.op]
            if op.supports_many is not None:
                out.extend(k for k, ok in zip(keys, op.supports_many(keys, problem)) if ok)
            else:
                supports = op.supports
                out.extend(k for k in keys if supports(k, problem) is None)
        return out

    def shortlist(self, problem, keys: Iterable[KernelKey], backend: Optional[str] = None) -> list[KernelKey]:
        """Those of ``keys`` (an op's first picks) that this registry holds and that compute
        ``problem``, in the given order: selection without listing every candidate."""
        supports = self.mgr.op(problem.op).supports
        out, seen = [], set()
        arch, listed, removed, spaces = self.arch, self._keys, self._removed, self._spaces
        for k in keys:
            if k in seen or (backend and k.backend != backend) or k.arch != arch:
                continue
            seen.add(k)
            # ``k in self``, inlined: listed, or in a space and not removed from it
            if k in listed:
                held = True
            elif not spaces or k in removed:
                held = False
            else:
                held = k in spaces[0] if len(spaces) == 1 else self._in_spaces(k)
            if held and supports(k, problem) is None:
                out.append(k)
        return out

    def why_not(self, problem, limit: int = 5) -> list[str]:
        """Why no key supports ``problem`` (for error messages): up to ``limit`` distinct reasons,
        the rarest first (the near misses; "wrong family" is said by most keys), each with how many
        keys gave it and one of them."""
        ops = self.mgr.ops()
        by_reason: dict[str, list[str]] = {}
        for key in self:
            if key.op != problem.op:
                continue
            reason = ops[key.op].supports(key, problem)
            if reason:
                by_reason.setdefault(str(reason), []).append(key.name)
        ranked = sorted(by_reason.items(), key=lambda kv: len(kv[1]))[:limit]
        return [f"{names[0]}: {reason}" + (f" (and {len(names) - 1} more keys)" if len(names) > 1 else "")
                for reason, names in ranked]

    # -- JSON --------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "name": self.name, "arch": self.arch,
                "kernels": [k.to_dict() for k in self]}

    def export_json(self, path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p

    @classmethod
    def from_dict(cls, data: dict, manager: Optional[PluginManager] = None) -> "Registry":
        """A registry of untrusted data: every record's fields are checked by its op, and
        a key the arch's or op's enumeration rules would reject is refused (ConfigError)."""
        if not isinstance(data, dict):
            raise ConfigError(f"not a registry file: the top level is a {type(data).__name__}, "
                              f"expected an object with format {FORMAT!r}")
        if data.get("format") != FORMAT:
            raise ConfigError(f"not a registry file (format {str(data.get('format'))[:60]!r}, "
                              f"expected {FORMAT!r})")
        unknown = sorted(str(k)[:40] for k in data if k not in _FILE_FIELDS)
        if unknown:
            raise ConfigError(f"registry file has unknown field(s) {unknown}; "
                              f"known: {', '.join(sorted(_FILE_FIELDS))}")
        arch, kernels, name = data.get("arch"), data.get("kernels"), data.get("name", "")
        if not isinstance(arch, str):
            raise ConfigError("registry file: 'arch' must be an arch name such as 'gfx942'")
        check_name(arch, "registry arch")
        if not isinstance(kernels, list):
            raise ConfigError("registry file: 'kernels' must be a list of kernel records")
        if not isinstance(name, str) or len(name) > 200:
            raise ConfigError("registry file: 'name' must be a string (at most 200 characters)")
        mgr = manager or get_manager()
        try:
            archspec = mgr.arch(arch)
        except PluginError as exc:
            raise ConfigError(f"registry file for arch {arch!r}: {exc}") from None
        reg = cls(arch, name=name, manager=manager)
        for i, rec in enumerate(kernels):
            try:
                key = KernelKey.from_dict(rec, manager=mgr)
                mgr.backend(key.backend)
                if key.arch != arch:
                    raise ConfigError(f"kernel {key.name} is for arch {key.arch}, the file for {arch}")
                reason = rejection(key, archspec, mgr)
                if reason:
                    raise ConfigError(f"kernel {key.name} is not legal on {arch}: {reason}")
            except PluginError as exc:
                raise ConfigError(f"registry kernel record {i}: {exc}") from None
            except CkError as exc:
                raise type(exc)(f"registry kernel record {i}: {exc}") from None
            reg.add(key)
        return reg

    @classmethod
    def import_json(cls, path, manager: Optional[PluginManager] = None) -> "Registry":
        p = Path(path)
        data = fileio.read_json(p, "registry file", MAX_FILE_BYTES,
                                hint="pass a file written by `ck export` (or `Registry.export_json`)")
        try:
            return cls.from_dict(data, manager=manager)
        except CkError as exc:  # name the file: the record alone does not say where it came from
            raise type(exc)(f"{p}: {exc}") from None

    # -- build ---------------------------------------------------------------
    def build(self, max_workers: Optional[int] = None, progress: Optional[bool] = None,
              force: bool = False):
        """Compile every kernel through its backend; failures are reported, removed, never fatal."""
        from .build import build_registry

        return build_registry(self, max_workers=max_workers, progress=progress, force=force)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, arch={self.arch!r}, kernels={len(self)})"
