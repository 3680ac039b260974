"""On-disk, content-addressed kernel cache.

Contract (after Triton's runtime cache and FlashInfer's JIT):
* the entry key is the SHA-256 of everything that changes the binary: core
  version, template source hash, compiler name and version, target, compile
  options and the kernel name; the entry's path is made from that hash alone
  (``<root>/<h[:2]>/<h[:40]>.bin``), never from a kernel name or other text, and
  the readable kernel name lives in the entry's JSON record;
* builds run under a per-entry file lock and re-check the cache after taking
  it, so concurrent processes build once;
* files are written to a temporary name and ``os.replace``-d into place; the
  JSON record (written last) carries the binary's SHA-256, so a torn, corrupted
  or otherwise malformed entry (a record that is not an object, garbage bytes,
  a folder where a file belongs) is detected on load, removed and rebuilt;
* temporary files a killed writer left behind are removed at the next write
  into their folder once older than :data:`ORPHAN_SECONDS`, and by ``clear()``;
* a cache folder that cannot be written (read-only file system, no permission)
  does not stop a build: the binary is built in memory and returned uncached,
  with one warning per folder;
* the record carries the digest of the key material it was built for (and the
  material itself, for people reading it): an entry copied over another
  specialisation's entry is not that entry and is rebuilt;
* nothing below the root is followed through a link: an entry folder, binary,
  record or lock that is a symbolic link is an unreadable entry (absent: rebuilt,
  the link removed, never written through);
* read-only roots (:attr:`KernelCache.extra_roots`: a prebuilt kernel set, e.g. an
  installed ``ck-kernels-<arch>`` distribution) are searched after the root; what
  is built goes to the root.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Optional

from . import knobs
from .errors import ConfigError

log = logging.getLogger(__name__)

#: temporary files older than this are a dead writer's leftovers
ORPHAN_SECONDS = 600
_TMP_PREFIX = ".tmp-"
#: errors that mean "this folder cannot be written here", not "the folder is misconfigured"
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)
_warned: set = set()


def digest(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def atomic_write(path: Path, data: bytes, prefix: str = _TMP_PREFIX) -> None:
    """Write ``data`` to ``path`` through a temporary file (named ``prefix...``) in the same folder."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def sweep_orphans(folder: Path, max_age: float = ORPHAN_SECONDS, prefix: str = _TMP_PREFIX) -> int:
    """Remove temporary files (``prefix...``) older than ``max_age`` seconds from ``folder``;
    returns how many."""
    now, n = time.time(), 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for e in entries:
        if not e.name.startswith(prefix) or not e.is_file(follow_symlinks=False):
            continue
        try:
            if now - e.stat(follow_symlinks=False).st_mtime > max_age:
                os.unlink(e.path)
                n += 1
        except OSError:   # another process removed or renamed it
            pass
    return n


def remove_path(path: Path) -> None:
    """Remove a file, link or folder at ``path`` if there is one (a link itself, not its target)."""
    try:
        if not path.is_symlink() and path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def ensure_folder(folder: Path, what: str = "cache folder", report: Optional[Path] = None) -> bool:
    """Create ``folder``; False (with one warning) when it cannot be written here.

    A path blocked by a file (``CK_CACHE_DIR`` naming a file, or a file on the way)
    is a ConfigError saying what to change.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK | os.X_OK):
            return True
        err = PermissionError(errno.EACCES, "not writable")
    except (FileExistsError, NotADirectoryError):
        blocker = knobs.blocking_file(folder) or folder
        raise ConfigError(f"the {what} {folder} cannot be created: {blocker} is a file, not a folder; "
                          f"set CK_CACHE_DIR to a folder (it is created if missing)") from None
    except OSError as exc:
        if exc.errno not in _UNWRITABLE:
            raise ConfigError(f"the {what} {folder} cannot be created: {exc.strerror or exc}; "
                              f"set CK_CACHE_DIR to a writable folder") from None
        err = exc
    warn_unwritable(report or folder, err)
    return False


def warn_unwritable(folder: Path, exc: OSError) -> None:
    if str(folder) not in _warned:
        _warned.add(str(folder))
        log.warning("the cache folder %s cannot be written (%s): building without caching; set "
                    "CK_CACHE_DIR to a writable folder to keep what is built", folder,
                    exc.strerror or exc)


@contextmanager
def file_lock(path: Path):
    """An exclusive lock on ``path`` (created); a link there is removed, never followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.islink(path) or path.is_dir():   # a link or a folder where the lock file belongs
        remove_path(path)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        remove_path(path)   # linked between the check and the open
        fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


#: entry-point group of installed prebuilt kernel sets (``ck build --wheel``): each names a
#: module whose folder holds ``kernels/`` (a cache root of built entries)
KERNEL_SETS_GROUP = "ck_core.kernel_sets"


def prebuilt_roots() -> list:
    """The read-only roots of prebuilt kernel sets: ``CK_KERNEL_SETS`` folders, then the installed
    distributions' (entry points :data:`KERNEL_SETS_GROUP`); ``CK_KERNEL_SETS=none``: none."""
    text = knobs.get("CK_KERNEL_SETS")
    if text.strip().lower() == "none":
        return []
    roots = [Path(p).expanduser() for p in text.split(os.pathsep) if p.strip()]
    roots = [r / "kernels" if (r / "kernels").is_dir() else r for r in roots]
    return roots + list(_installed_sets())


def _installed_sets() -> tuple:
    global _INSTALLED
    if _INSTALLED is None:
        from importlib import metadata, util

        found = []
        try:
            eps = list(metadata.entry_points(group=KERNEL_SETS_GROUP))
        except TypeError:   # Python < 3.10
            eps = list(metadata.entry_points().get(KERNEL_SETS_GROUP, []))
        for ep in eps:
            try:   # the module's folder, without importing it (a kernel set is data)
                spec = util.find_spec(ep.value.split(":")[0])
                origin = spec and spec.origin
            except (ImportError, ValueError) as exc:
                log.warning("kernel set %s cannot be found (%s); skipping it", ep.name, exc)
                continue
            if origin and (Path(origin).parent / "kernels").is_dir():
                found.append(Path(origin).parent / "kernels")
        _INSTALLED = tuple(found)
    return _INSTALLED


_INSTALLED: Optional[tuple] = None


class _Linked(OSError):
    """A symbolic link where the cache keeps a real file or folder."""


class KernelCache:
    """``root``: where entries are read and written (default ``$CK_CACHE_DIR/kernels``).
    ``extra_roots``: folders of prebuilt entries searched after it, read-only (default: the
    prebuilt kernel sets installed as distributions, :func:`prebuilt_roots`)."""

    def __init__(self, root: Optional[os.PathLike] = None, extra_roots=None):
        self.root = Path(root) if root else knobs.cache_dir() / "kernels"
        self.extra_roots = [Path(r) for r in (prebuilt_roots() if extra_roots is None else extra_roots)]

    @staticmethod
    def digest(kernel_name: str, material: dict) -> str:
        return digest(dict(material, kernel=kernel_name))

    def entry(self, kernel_name: str, material: dict) -> tuple[Path, Path]:
        h = self.digest(kernel_name, material)
        folder = self.root / h[:2]
        return folder / f"{h[:40]}.bin", folder / f"{h[:40]}.json"

    def load(self, kernel_name: str, material: dict) -> Optional[tuple[bytes, dict]]:
        """``(binary, record)`` of the entry, from the root or a read-only root; None if absent
        or unusable (unreadable, corrupted, another key's, reached through a link)."""
        got = self._load_from(self.root, kernel_name, material)
        if got is None:
            for root in self.extra_roots:
                got = self._load_from(root, kernel_name, material, quiet=True)
                if got is not None:
                    break
        return got

    def _load_from(self, root: Path, kernel_name: str, material: dict, quiet: bool = False):
        h = self.digest(kernel_name, material)
        folder = root / h[:2]
        bin_path, meta_path = folder / f"{h[:40]}.bin", folder / f"{h[:40]}.json"
        warn = log.debug if quiet else log.warning
        try:
            if not (os.path.lexists(bin_path) or os.path.lexists(meta_path)):
                return None
            if any(os.path.islink(x) for x in (folder, bin_path, meta_path)):
                raise _Linked(errno.ELOOP, "a symbolic link in the entry")
            if not (bin_path.is_file() and meta_path.is_file()):
                raise IsADirectoryError(errno.EISDIR, "not a file")
            meta = json.loads(meta_path.read_bytes())
            blob = bin_path.read_bytes()
        except (OSError, ValueError, RecursionError) as exc:
            warn("cache entry %s of %s is unreadable (%s); rebuilding it", bin_path, kernel_name,
                 type(exc).__name__)
            return None
        if not (isinstance(meta, dict) and meta.get("kernel") == kernel_name
                and meta.get("sha256") == hashlib.sha256(blob).hexdigest()):
            warn("cache entry %s of %s is corrupted; rebuilding it", bin_path, kernel_name)
            return None
        if meta.get("digest") != h:
            warn("cache entry %s of %s was built for other key material (a copied entry?); "
                 "rebuilding it", bin_path, kernel_name)
            return None
        return blob, meta

    def get_or_build(self, kernel_name: str, material: dict,
                     build: Callable[[], tuple[bytes, dict]],
                     validate: Optional[Callable[[bytes, dict], bool]] = None) -> tuple[bytes, dict, bool]:
        """Return ``(binary, metadata, was_hit)``; builds at most once across processes.

        ``validate(binary, metadata)``: False rejects an intact-looking entry whose
        content the caller cannot use (it is rebuilt, like a corrupted one)."""
        def load():
            got = self.load(kernel_name, material)
            if got and validate is not None and not validate(*got):
                return None
            return got

        hit = load()
        if hit:
            return hit[0], hit[1], True
        bin_path, meta_path = self.entry(kernel_name, material)

        def fresh():
            blob, meta = build()
            return blob, dict(meta, sha256=hashlib.sha256(blob).hexdigest(), kernel=kernel_name,
                              digest=self.digest(kernel_name, material), material=material)

        # a link or a file where an entry folder belongs: damage, not config; never written through
        if os.path.islink(bin_path.parent) or bin_path.parent.is_file():
            remove_path(bin_path.parent)
        if not ensure_folder(bin_path.parent, report=self.root):
            blob, meta = fresh()
            return blob, meta, False
        with ExitStack() as stack:
            try:
                stack.enter_context(file_lock(bin_path.with_suffix(".lock")))
            except OSError as exc:
                if exc.errno not in _UNWRITABLE:
                    raise
                warn_unwritable(self.root, exc)
                blob, meta = fresh()
                return blob, meta, False
            hit = load()  # another process may have built it
            if hit:
                return hit[0], hit[1], True
            blob, meta = fresh()
            if os.path.islink(bin_path.parent):   # linked while we built: write nothing through it
                log.warning("the cache entry folder %s became a link; not writing through it", bin_path.parent)
                return blob, meta, False
            try:
                sweep_orphans(bin_path.parent)
                remove_path(meta_path)      # the record goes first: no record, no entry
                remove_path(bin_path)
                atomic_write(bin_path, blob)
                atomic_write(meta_path, json.dumps(meta, indent=1, default=str).encode())
            except OSError as exc:
                if exc.errno not in _UNWRITABLE:
                    raise
                warn_unwritable(self.root, exc)
            return blob, meta, False

    def _entries(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.glob("*/*.bin")]

    def clear(self) -> int:
        """Delete every entry (and any leftover temporary file); returns the number of entries removed."""
        if not self.root.exists():
            return 0
        n = len(self._entries())
        remove_path(self.root)
        return n

    def sweep(self, max_age: float = ORPHAN_SECONDS) -> int:
        """Remove dead writers' temporary files from every entry folder; returns how many."""
        if not self.root.is_dir():
            return 0
        return sum(sweep_orphans(p, max_age) for p in self.root.iterdir() if p.is_dir())

    def stats(self) -> dict:
        entries = self._entries()
        kernels = set()
        for p in entries:
            try:
                meta = json.loads(p.with_suffix(".json").read_bytes())
                kernels.add(meta.get("kernel") if isinstance(meta, dict) else None)
            except (OSError, ValueError, RecursionError):
                kernels.add(None)
        kernels.discard(None)
        return {"root": str(self.root), "kernels": len(kernels), "entries": len(entries),
                "bytes": sum(p.stat().st_size for p in entries if p.is_file()),
                "prebuilt_roots": [str(r) for r in self.extra_roots]}
