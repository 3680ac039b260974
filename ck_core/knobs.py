"""Every ``CK_*`` environment variable, declared once, typed and documented.

Read a knob with ``knobs.get("CK_CACHE_DIR")`` (parsed on every call, so tests
can monkeypatch the environment); ``ck knobs`` prints this table.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import attrs

from .errors import ConfigError


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``): the one reader
    of that variable for the core and the plugins."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("expected a non-negative integer")
    return value


@attrs.frozen
class Knob:
    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


#: the core's knobs; plugins declare theirs through the ``ck_declare_knobs`` hook
KNOBS: dict[str, Knob] = {}

# parsers for plugins' knobs
parse_bool, parse_names, parse_int = _bool, _names, _int


def _declare(name: str, parse: Callable[[str], Any], default: Any, doc: str) -> None:
    KNOBS[name] = Knob(name, parse, default, doc)


_declare("CK_DISABLE_PLUGIN_AUTOLOAD", _bool, False,
         "Do not load plugins from entry points; only built-ins and plugins passed explicitly.")
_declare("CK_PLUGINS", _names, (),
         "Comma-separated allow-list of plugin names (entry-point names); empty means all.")
_declare("CK_BLOCK_PLUGINS", _names, (),
         "Comma-separated block-list of plugin names never to load.")
_declare("CK_CACHE_DIR", str, "",
         "Kernel cache folder; default $XDG_CACHE_HOME/ck-dispatcher or ~/.cache/ck-dispatcher.")
_declare("CK_BACKEND", str, "",
         "Default backend for `ck run` and Dispatcher when none is given (numpy, triton, ck).")
_declare("CK_CPU_ARCH", str, "",
         "Arch whose kernel space the public APIs dispatch in for CPU tensors (numpy backend, or the "
         "Triton interpreter); default gfx942 when installed, else the first installed arch by name.")
_declare("CK_KERNEL_SETS", str, "",
         "Folders of prebuilt kernel sets (`ck build --preset NAME --out DIR`), separated by the path "
         "separator, searched read-only after the kernel cache; 'none': not even the installed "
         "ck-kernels-* distributions (entry points ck_core.kernel_sets).")
_declare("CK_RESULTS_COMMIT", str, "",
         "The commit a results file names (ck_core.bench.result_header) when the checkout's own git "
         "history is not the code that ran (a copied working tree); default: the checkout's HEAD.")
_declare("CK_BUILD_WORKERS", _int, 0,
         "Default number of build worker processes; 0 means the number of CPUs.")
_declare("CK_TUNED_DIR", str, "",
         "The user's tuned-data store: the folder `ck tune` and CK_AUTOTUNE write measured winners "
         "into, read over the op plugins' shipped tables; default <cache dir>/tuning.d "
         "(docs/tuned-data.md).")
_declare("CK_TUNING_DB", str, "",
         "Older way to place the tuned-data store: a path NAME.json puts it in the folder NAME.d "
         "beside it (CK_TUNED_DIR wins).  The single-file tuning table this once named is retired: "
         "it is not read; run `ck tune` again to record its winners in the store.")
_declare("CK_ROCM_PATH", str, "", "ROCm install prefix holding bin/hipcc (default /opt/rocm).")
_declare("CK_TILE_INCLUDE", str, "",
         "Folder with composable_kernel's include/ (ck_tile headers) for the ck backend.")
_declare("CK_AUTOTUNE", _bool, False,
         "Time the ranker's top candidates on the first call of each new problem bucket and record "
         "the winner in the user's tuned-data store (never in package data).")
_declare("CK_AUTOTUNE_TOP", _int, 4,
         "How many of the ranked candidates CK_AUTOTUNE times per new bucket.")
_declare("CK_PROGRESS", _bool, True,
         "Show progress on stderr: bars on a terminal, a line every 30 s elsewhere (0: none).")


#: callables giving the knobs that installed plugins declare; ck_core.plugins adds its manager's (the
#: plugin layer sits above this module: knobs never imports it)
_SOURCES: list[Callable[[], dict]] = []


def add_source(fn: Callable[[], dict]) -> None:
    """Declare where more knobs come from (``ck_core.plugins`` registers the plugins' knobs)."""
    if fn not in _SOURCES:
        _SOURCES.append(fn)


def _plugin_knobs() -> dict:
    out: dict = {}
    for fn in _SOURCES:
        out.update(fn())
    return out


def all_knobs() -> dict[str, Knob]:
    """The core's knobs and those the installed plugins declare."""
    return {**KNOBS, **_plugin_knobs()}


def get(name: str) -> Any:
    knob = KNOBS.get(name)
    if knob is None:
        knob = _plugin_knobs().get(name)
    if knob is None:
        raise ConfigError(f"unknown knob {name!r}; known knobs: {', '.join(all_knobs())}")
    raw = os.environ.get(name)
    if raw is None:
        return knob.default
    try:
        return knob.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name}={raw!r} is invalid: {exc}") from None


def cache_dir() -> Path:
    """The cache folder (not created here); a path that names a file is a ConfigError."""
    explicit = get("CK_CACHE_DIR")
    if explicit:
        path, what = Path(explicit).expanduser(), f"CK_CACHE_DIR={explicit!r}"
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path, what = Path(base) / "ck-dispatcher", f"the default cache folder {base}/ck-dispatcher"
    blocker = blocking_file(path)
    if blocker is not None:
        raise ConfigError(f"{what} cannot be the cache folder: {blocker} is a file, not a folder; "
                          f"set CK_CACHE_DIR to a folder (it is created if missing) or unset it")
    return path


def tuned_dir() -> Path:
    """The user's tuned-data store folder: ``CK_TUNED_DIR``, else ``NAME.d`` beside
    ``CK_TUNING_DB=NAME.json`` (the older knob), else ``<cache dir>/tuning.d``."""
    explicit = get("CK_TUNED_DIR")
    if explicit:
        return Path(explicit).expanduser()
    db = get("CK_TUNING_DB")
    if db:
        db = Path(db).expanduser()
        return db.with_name(db.stem + ".d")
    return cache_dir() / "tuning.d"


def retired_tuning_files() -> list:
    """Where the retired single-file tuning table used to live (``<cache dir>/tuning.json``, and
    ``CK_TUNING_DB`` when set): files there are no longer read."""
    db = get("CK_TUNING_DB")
    try:
        old = [cache_dir() / "tuning.json"]
    except ConfigError:   # no usable cache folder: no old table there either (the store may live elsewhere)
        old = []
    return old + ([Path(db).expanduser()] if db else [])


def blocking_file(path: Path):
    """The first of ``path`` and its parents that exists and is not a folder, or None."""
    for p in (path, *path.parents):
        try:
            if p.exists() and not p.is_dir():
                return p
        except OSError:   # unreadable: not known to block
            pass
    return None


def build_workers() -> int:
    return get("CK_BUILD_WORKERS") or (os.cpu_count() or 1)
