"""KernelKey: Signature (what) + Algorithm (how) + arch + backend.

The key's ``name`` is its identity everywhere (registry, cache metadata, CSV
rows, JSON).  It reads ``<body>.<arch>.<backend>`` where ``body`` comes from
the op plugin (``gemm_fp16_rcr_compv4_...``), and parses back to the same key.

Keys made from outside text (JSON records, names) are checked field by field
(:class:`RecordSchema`, used by each op's ``from_fields``/``parse_name``) and
their names must stay in a safe alphabet (:func:`check_name`); cache paths are
hashes all the same (:mod:`ck_core.cache`), never names.
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Mapping, Optional

import attrs

from .errors import CkError, ConfigError, MissingKernel, PluginError

_NAME_TAIL = re.compile(r"^(?P<body>.+)\.(?P<arch>[A-Za-z0-9_-]+)\.(?P<backend>[A-Za-z0-9_-]+)$")
#: what a kernel name may hold: names appear in logs, CSV rows, generated sources and
#: metadata, so a key whose name leaves this alphabet is refused wherever it is made
#: from outside text (JSON records, names on the command line)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,511}$")
#: one name-safe token for a string field the op does not enumerate itself
_TOKEN = re.compile(r"^[A-Za-z0-9_]{0,64}$")
_TOKEN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
#: default bounds of integer key fields (tile sizes, warps, stages...)
INT_BOUNDS = (0, 1 << 20)
_RECORD_FIELDS = frozenset({"name", "op", "arch", "backend", "signature", "algorithm"})


@functools.lru_cache(maxsize=64)
def _takes_tail(parse_name) -> bool:
    """Whether an op's ``parse_name`` takes the name's ``arch`` and ``backend`` keywords."""
    try:
        params = inspect.signature(parse_name).parameters
    except (TypeError, ValueError):
        return False
    return "arch" in params and "backend" in params


def check_name(name: str, what: str = "kernel name") -> str:
    """``name`` when it is a safe kernel name (no ``/``, no ``..``, no spaces), else ConfigError."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise ConfigError(f"{what} {str(name)[:80]!r} holds characters a kernel name may not "
                          f"(letters, digits and _ . + - only, no '..'); the record is malformed")
    return name


def _field_kind(field: "attrs.Attribute") -> str:
    t = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    t = t.replace("typing.", "")
    if t in ("int", "str", "bool"):
        return t
    if t.lower().startswith("tuple"):
        return "tuple"
    if field.default is not attrs.NOTHING and not isinstance(field.default, attrs.Factory):
        return {bool: "bool", int: "int", str: "str", tuple: "tuple"}.get(type(field.default), "any")
    return "any"


class RecordSchema:
    """How to build the attrs record ``cls`` from an untrusted mapping, field by field.

    Every field is type-checked (ints are ints, not bools or floats; bools are bools;
    tuples hold ints), integers lie in ``bounds[field]`` (default :data:`INT_BOUNDS`:
    no negative sizes), strings lie in ``choices[field]`` when given, else are one
    name-safe token.  Unknown and missing fields are errors.  Every failure is a
    ConfigError naming ``what`` and the field, so import refuses a record before any
    of its values reaches a name, a path or a template.  Build one per record class
    (the checks are prepared once); call it on each mapping.
    """

    def __init__(self, cls, *, what: str, choices: Optional[Mapping[str, Any]] = None,
                 bounds: Optional[Mapping[str, tuple]] = None):
        choices, bounds = dict(choices or {}), dict(bounds or {})
        fields = [f for f in attrs.fields(cls) if f.init and not f.name.startswith("_")]
        self.cls, self.what = cls, what
        self.required = tuple(f.name for f in fields if f.default is attrs.NOTHING)
        self.required_set = frozenset(self.required)
        self.tuples = frozenset(f.name for f in fields if _field_kind(f) == "tuple")
        self.checks = {f.name: self._check(f.name, _field_kind(f), choices.get(f.name),
                                           bounds.get(f.name, INT_BOUNDS)) for f in fields}

    def _check(self, name, kind, allowed, bound):
        lo, hi = bound
        if kind == "int":
            return lambda v: type(v) is int and lo <= v <= hi, f"an integer in [{lo}, {hi}]"
        if kind == "bool":
            return lambda v: type(v) is bool, "true or false"
        if kind == "tuple":
            return (lambda v: isinstance(v, (list, tuple)) and len(v) <= 32
                    and all(type(x) is int and lo <= x <= hi for x in v),
                    f"a list of at most 32 integers in [{lo}, {hi}]")
        if kind == "str" and allowed is not None:
            allowed = frozenset(allowed)
            return lambda v: type(v) is str and v in allowed, f"one of {sorted(allowed)}"
        if kind == "str":
            return (lambda v: type(v) is str and _TOKEN.match(v) is not None,
                    "a string of one token of letters, digits and _")
        return (lambda v: False), "a plain value"   # a field of a kind the record does not declare

    def __call__(self, data):
        what, checks = self.what, self.checks
        if type(data) is not dict and not isinstance(data, Mapping):
            raise ConfigError(f"{what} must be a JSON object of fields, got {type(data).__name__}")
        for name, value in data.items():
            check = checks.get(name)
            if check is None:
                unknown = sorted(str(k)[:40] for k in data if k not in checks)
                raise ConfigError(f"{what}: unknown field(s) {unknown}; known: {', '.join(checks)}")
            if not check[0](value):
                raise ConfigError(f"{what}: field {name!r} must be {check[1]}, got {str(value)[:60]!r}")
        if not self.required_set <= data.keys():
            raise ConfigError(f"{what}: missing field(s) {[n for n in self.required if n not in data]}")
        if self.tuples:
            data = {k: (tuple(v) if k in self.tuples else v) for k, v in data.items()}
        try:
            return self.cls(**data)
        except CkError:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"{what}: {type(exc).__name__}: {exc}") from None


def _to_plain(obj) -> dict:
    if attrs.has(type(obj)):
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in attrs.asdict(obj, recurse=False).items()}
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


@attrs.frozen(cache_hash=True)
class KernelKey:
    op: str
    signature: Any
    algorithm: Any
    arch: str
    backend: str = "numpy"
    _flat: Any = attrs.field(default=None, init=False, eq=False, hash=False, repr=False)

    @property
    def body(self) -> str:
        fmt = getattr(self.signature, "name_body", None)
        if fmt is not None:  # signature classes may name themselves (no manager needed)
            return fmt(self.algorithm)
        from .plugins import get_manager

        return get_manager().op(self.op).format_name(self.signature, self.algorithm)

    @property
    def name(self) -> str:
        return f"{self.body}.{self.arch}.{self.backend}"

    @property
    def fields(self) -> dict:
        """All signature and algorithm fields in one flat dict (for filters); computed once."""
        if self._flat is None:
            out = {"op": self.op, "arch": self.arch, "backend": self.backend}
            out.update(_to_plain(self.signature))
            out.update(_to_plain(self.algorithm))
            object.__setattr__(self, "_flat", out)
        return self._flat

    def with_backend(self, backend: str) -> "KernelKey":
        return attrs.evolve(self, backend=backend)

    def with_arch(self, arch: str) -> "KernelKey":
        return attrs.evolve(self, arch=arch)

    def to_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "arch": self.arch, "backend": self.backend,
                "signature": _to_plain(self.signature), "algorithm": _to_plain(self.algorithm)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], manager=None) -> "KernelKey":
        """The key of a JSON record, every field checked (types, the op's vocabulary, a safe
        name); a malformed record is a ConfigError naming the field."""
        from .plugins import get_manager

        mgr = manager or get_manager()
        if not isinstance(data, Mapping):
            raise ConfigError(f"a kernel record must be a JSON object, got {type(data).__name__}")
        unknown = sorted(str(k)[:40] for k in data if k not in _RECORD_FIELDS)
        if unknown:
            raise ConfigError(f"kernel record has unknown field(s) {unknown}; "
                              f"known: {', '.join(sorted(_RECORD_FIELDS))}")
        missing = [k for k in ("op", "arch", "signature", "algorithm") if k not in data]
        if missing:
            raise ConfigError(f"kernel record lacks the field(s) {missing}; expected op, arch, "
                              f"backend, signature, algorithm")
        for k in ("op", "arch", "backend"):
            if k in data and not (isinstance(data[k], str) and _TOKEN_ID.match(data[k])):
                raise ConfigError(f"kernel record field {k!r} must be a name like 'gemm' or "
                                  f"'gfx942', got {str(data[k])[:60]!r}")
        if "name" in data and not isinstance(data["name"], str):
            raise ConfigError("kernel record field 'name' must be a string")
        try:
            op = mgr.op(data["op"])
        except PluginError as exc:
            raise ConfigError(f"kernel record: {exc}") from None
        sig, alg = op.from_fields(data["signature"], data["algorithm"])
        key = cls(op.name, sig, alg, data["arch"], data.get("backend", "numpy"))
        check_name(key.name)
        if "name" in data and data["name"] != key.name:
            raise MissingKernel(
                f"kernel record name {data['name']!r} disagrees with its fields ({key.name!r}); "
                f"the file was edited or written by another version"
            )
        return key

    @classmethod
    def from_name(cls, name: str, manager=None) -> "KernelKey":
        from .plugins import get_manager

        mgr = manager or get_manager()
        m = _NAME_TAIL.match(name) if isinstance(name, str) else None
        if m and (not _SAFE_NAME.match(name) or ".." in name):
            raise MissingKernel(f"kernel name {name[:80]!r} holds characters a kernel name may not "
                                f"(letters, digits and _ . + - only, no '..')")
        if not m:
            raise MissingKernel(
                f"kernel name {name!r} is not of the form <body>.<arch>.<backend>, "
                f"e.g. gemm_fp16_rcr_..._32x32x16.gfx942.numpy"
            )
        try:
            op = mgr.op_for_name(m["body"])
        except PluginError as exc:
            raise MissingKernel(str(exc)) from None
        if _takes_tail(op.parse_name):   # the body does not repeat them: an op may need them to parse it
            sig, alg = op.parse_name(m["body"], arch=m["arch"], backend=m["backend"])
        else:
            sig, alg = op.parse_name(m["body"])
        key = cls(op.name, sig, alg, m["arch"], m["backend"])
        try:
            check_name(key.name)
        except ConfigError as exc:
            raise MissingKernel(str(exc)) from None
        return key

    def __str__(self) -> str:
        return self.name
