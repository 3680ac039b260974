"""The tuned-data store: measured and hand-tuned tables per (op, arch), as data files.

One JSON file per (op, arch) -- ``<arch>.json`` -- holds named tables.  Each
table maps a key (a problem bucket, or a key the op plugin defines, stored as a
JSON list) to a value (any JSON), and every file says where its numbers came
from::

    {"format": "ck-dispatcher.tuned-data/1", "op": "fmha", "arch": "sm90",
     "provenance": {"command": ..., "date": ..., "device": ..., "source": ...},
     "tables": {"fwd_tuned": {"key": ["hdim", "causal", "seqlen"],
                              "provenance": {...},          # optional, per table
                              "meta": {...},                # optional, free-form facts
                              "entries": [{"key": [64, false, 512], "value": {...}}, ...]}}}

Two layers, read in order: the files an op plugin ships (the folder its OpSpec
names in ``tuning_data``, or that a plugin passes as ``shipped``), then the
user's writable store (``CK_TUNED_DIR``, by default ``<cache dir>/tuning.d/``;
:func:`ck_core.knobs.tuned_dir`), whose entries override shipped entries with
the same key.  Loading is cached per (op, arch, folders), and the store's
location is resolved once: a warm lookup reads no file and no environment
(:func:`clear_cache` forgets both).  A file that is not valid tuned data is a ConfigError naming it.
"""
from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import types
from datetime import date
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from . import fileio, knobs
from .errors import CkError, ConfigError

FORMAT = "ck-dispatcher.tuned-data/1"
#: most bytes one (op, arch) data file may hold (tables and ranker models together)
MAX_FILE_BYTES = fileio.LIMITS["tuned"]
#: most entries one table may hold, and most characters a key's string field may have
MAX_ENTRIES = 1 << 20
_HINT = "fix or delete the file (the user's store is CK_TUNED_DIR, default <cache dir>/tuning.d; `ck tune` rewrites it)"
#: what every provenance record must say
PROVENANCE_FIELDS = ("command", "date", "device", "source")
#: op and arch names become file and folder names
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def _check_names(op: str, arch: str) -> None:
    for what, name in (("op", op), ("arch", arch)):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(f"tuned data: {what} name {name!r} cannot name a data file (letters, digits, "
                              f"'_', '.', '+', '-'; not starting with '.')")


def user_dir() -> Path:
    """The writable store (``CK_TUNED_DIR``; :func:`ck_core.knobs.tuned_dir`)."""
    return knobs.tuned_dir()


@functools.lru_cache(maxsize=1)
def _user_root() -> str:
    # resolved once (clear_cache() forgets it): reading the environment costs more than a lookup
    return str(user_dir())


class Table:
    """One tuned table: ``key tuple -> value``, read-only, with its provenance."""

    def __init__(self, name: str, fields: tuple, entries: dict, provenance: dict, meta: dict,
                 origin: dict, files: Optional[dict] = None):
        self.name = name
        self.fields = fields
        self.entries = types.MappingProxyType(entries)
        self.provenance = types.MappingProxyType(provenance)
        self.meta = types.MappingProxyType(meta)
        self._origin = origin  # key -> provenance of the layer the entry came from
        self._files = files or {}  # key -> the file the entry came from
        self._checked: set = set()  # the value checks every entry has passed

    def file_of(self, key) -> str:
        """The data file an entry came from ('?' for a table built in memory)."""
        return self._files.get(_as_key(key), "?")

    def checked(self, check) -> "Table":
        """This table once ``check(key, value)`` has passed for every entry (run once per loaded
        table); a value it refuses (ConfigError, ValueError, TypeError, KeyError) is a ConfigError
        naming the file, the table and the entry: bad tuned data is refused where it is read, not
        where a kernel launches with it."""
        if check is None or not self.entries or check in self._checked:
            return self
        for key, value in self.entries.items():
            try:
                check(key, value)
            except (CkError, ValueError, TypeError, KeyError, AttributeError) as exc:
                why = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
                what = f"missing field {why!r}" if isinstance(exc, KeyError) else str(why)
                raise ConfigError(f"tuned data {self.file_of(key)}: table {self.name!r} entry {list(key)!r:.80}: "
                                  f"{what[:300]}; {_HINT}") from None
        self._checked.add(check)
        return self

    def get(self, key, default=None):
        return self.entries.get(_as_key(key), default)

    def __getitem__(self, key):
        return self.entries[_as_key(key)]

    def __contains__(self, key) -> bool:
        return _as_key(key) in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def items(self):
        return self.entries.items()

    def provenance_of(self, key) -> Mapping:
        """Where one entry came from (a user override's provenance, else the table's)."""
        return self._origin.get(_as_key(key), self.provenance)

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {len(self.entries)} entries)"


EMPTY = Table("", (), {}, {}, {}, {})


def _as_key(key) -> tuple:
    return tuple(key) if isinstance(key, (list, tuple)) else (key,)


def _freeze(x):
    """JSON lists inside keys become tuples (hashable)."""
    return tuple(_freeze(v) for v in x) if isinstance(x, list) else x


def _check_provenance(path: Path, where: str, prov) -> dict:
    if not isinstance(prov, dict):
        raise ConfigError(f"tuned data {path}: {where} 'provenance' must be an object with "
                          f"{', '.join(PROVENANCE_FIELDS)}")
    missing = [f for f in PROVENANCE_FIELDS if not isinstance(prov.get(f), str) or not prov.get(f)]
    if missing:
        raise ConfigError(f"tuned data {path}: {where} provenance lacks {', '.join(missing)} "
                          f"(say which command, date, device and source produced the numbers)")
    return dict(prov)


def parse(path: Path, text: str, op: Optional[str] = None, arch: Optional[str] = None) -> dict:
    """Validate one file's text; returns ``{table name: (fields, entries, provenance, meta)}``."""
    doc = fileio.loads_json(text, path, "tuned data", hint=_HINT)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(f"tuned data {path}: format is {got!r}, expected {FORMAT!r}; regenerate the file "
                          f"(`ck tune` writes this format)")
    for field, want in (("op", op), ("arch", arch)):
        if want is not None and doc.get(field) != want:
            raise ConfigError(f"tuned data {path}: {field} is {doc.get(field)!r}, but the file is read as "
                              f"{field} {want!r}; rename or move it")
    file_prov = _check_provenance(path, "the file's", doc.get("provenance"))
    tables = doc.get("tables")
    if not isinstance(tables, dict):
        raise ConfigError(f"tuned data {path}: 'tables' must be an object of named tables")
    out = {}
    for name, t in tables.items():
        if not isinstance(t, dict) or not isinstance(t.get("entries"), list):
            raise ConfigError(f"tuned data {path}: table {name!r} must be an object with an 'entries' list")
        prov = file_prov if "provenance" not in t else \
            {**file_prov, **_check_provenance(path, f"table {name!r}", t["provenance"])}
        fields = tuple(t.get("key") or ())
        if not all(isinstance(f, str) for f in fields):
            raise ConfigError(f"tuned data {path}: table {name!r} 'key' must be a list of field names")
        if len(t["entries"]) > MAX_ENTRIES:
            raise ConfigError(f"tuned data {path}: table {name!r} has {len(t['entries'])} entries, more than "
                              f"{MAX_ENTRIES}; {_HINT}")
        meta = t.get("meta") or {}
        if not isinstance(meta, dict):
            raise ConfigError(f"tuned data {path}: table {name!r} 'meta' must be an object")
        entries = {}
        for i, e in enumerate(t["entries"]):
            if not isinstance(e, dict) or not isinstance(e.get("key"), list) or "value" not in e:
                raise ConfigError(f"tuned data {path}: table {name!r} entry {i} must be "
                                  f"{{\"key\": [...], \"value\": ...}}, got {e!r:.120}")
            key = _freeze(e["key"])
            if fields and len(key) != len(fields):
                raise ConfigError(f"tuned data {path}: table {name!r} entry {i} key {e['key']!r} has "
                                  f"{len(key)} fields, the table's key has {len(fields)} ({', '.join(fields)})")
            try:
                hash(key)
            except TypeError:
                raise ConfigError(f"tuned data {path}: table {name!r} entry {i} key {e['key']!r} holds an "
                                  f"object; keys are lists of numbers, strings and booleans") from None
            entries[key] = e["value"]
        out[name] = (fields, entries, prov, dict(meta))
    return out


def _read(path: Path, op: str, arch: str) -> dict:
    return parse(path, fileio.read_text(path, "tuned data", MAX_FILE_BYTES, hint=_HINT), op, arch)


@functools.lru_cache(maxsize=None)
def _load(op: str, arch: str, folders: tuple) -> types.MappingProxyType:
    merged: dict = {}
    for folder in folders:
        path = Path(folder) / f"{arch}.json"
        if not os.path.lexists(path):   # anything else there (a FIFO, a folder, a dangling link) is refused
            continue
        for name, (fields, entries, prov, meta) in _read(path, op, arch).items():
            if name not in merged:
                merged[name] = (fields, dict(entries), prov, dict(meta), {}, dict.fromkeys(entries, str(path)))
                continue
            f0, e0, p0, m0, origin, files = merged[name]
            files.update(dict.fromkeys(entries, str(path)))
            if fields and f0 and fields != f0:
                raise ConfigError(f"tuned data {path}: table {name!r} is keyed by {list(fields)}, the shipped "
                                  f"table by {list(f0)}; an override must use the same key")
            e0.update(entries)
            m0.update(meta)
            origin.update({k: prov for k in entries})
    return types.MappingProxyType({n: Table(n, f, e, p, m, o, fs) for n, (f, e, p, m, o, fs) in merged.items()})


def _shipped(op: str) -> Optional[str]:
    from .plugins import get_manager

    spec = get_manager().ops().get(op)
    return getattr(spec, "tuning_data", None) if spec is not None else None


def tables(op: str, arch: str, shipped=None) -> Mapping[str, Table]:
    """Every table of (op, arch): the plugin's shipped files overlaid by the user's store.

    ``shipped``: the folder of the plugin's data files (default: the op's
    ``OpSpec.tuning_data``)."""
    _check_names(op, arch)
    base = str(shipped) if shipped is not None else _shipped(op)
    user = _user_root() + os.sep + op
    return _load(op, arch, (base, user) if base else (user,))


def table(op: str, arch: str, name: str, shipped=None, check=None) -> Table:
    """One named table of (op, arch); an empty table when no layer has it.

    ``check(key, value)``: the op's validator of this table's records, run over every entry once
    per loaded table (:meth:`Table.checked`); pass the same function object each time."""
    return tables(op, arch, shipped).get(name, EMPTY).checked(check)


def clear_cache() -> None:
    """Forget loaded files and the store's location (after writing to the store, changing
    CK_TUNED_DIR / CK_TUNING_DB / CK_CACHE_DIR, or in tests)."""
    _load.cache_clear()
    _user_root.cache_clear()


_NUMBERS = re.compile(r"\[\s+([-+0-9.eE,\s]+?)\s+\]")


def _dumps(doc) -> str:
    """Indented JSON with each list of plain numbers on one line (a ranker's node arrays)."""
    return _NUMBERS.sub(lambda m: "[" + ",".join(x.strip() for x in m.group(1).split(",")) + "]",
                        json.dumps(doc, indent=1))


def write(op: str, arch: str, name: str, entries: Iterable[tuple[Any, Any]], *, command: str, device: str,
          source: str, fields: Iterable[str] = (), meta: Optional[dict] = None,
          folder: Optional[Path] = None) -> Path:
    """Record ``entries`` (``(key, value)`` pairs) into the user store (or ``folder``), atomically.

    Entries already in the file with other keys stay; the table's provenance
    becomes this write's (command, today's date, device, source)."""
    _check_names(op, arch)
    folder = Path(folder) if folder is not None else user_dir() / op
    path = folder / f"{arch}.json"
    prov = {"command": command, "date": date.today().isoformat(), "device": device, "source": source}
    doc = {"format": FORMAT, "op": op, "arch": arch, "provenance": prov, "tables": {}}
    if os.path.lexists(path):
        text = fileio.read_text(path, "tuned data", MAX_FILE_BYTES, hint=_HINT)
        parse(path, text, op, arch)  # refuse to build on a broken file
        doc = json.loads(text)
    t = doc["tables"].setdefault(name, {"key": list(fields), "entries": []})
    t["provenance"] = prov
    if meta:
        t.setdefault("meta", {}).update(meta)
    by_key = {json.dumps(e["key"]): e for e in t["entries"]}
    for key, value in entries:
        k = list(_as_key(key))
        by_key[json.dumps(k)] = {"key": k, "value": value}
    t["entries"] = list(by_key.values())
    try:
        text = _dumps(doc)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"tuned data for {path}: a value is not JSON ({exc})") from None
    parse(path, text, op, arch)  # never write what could not be read back
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tuned-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    clear_cache()
    return path
