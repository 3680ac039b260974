"""On-disk, content-addressed kernel cache.

Contract (after Triton's runtime cache and FlashInfer's JIT):
* the entry key is the SHA-256 of everything that changes the binary: core
  version, template source hash, compiler name and version, target, compile
  options and the kernel name;
* builds run under a per-entry file lock and re-check the cache after taking
  it, so concurrent processes build once;
* files are written to a temporary name and ``os.replace``-d into place; the
  JSON record (written last) carries the binary's SHA-256, so a torn or
  corrupted entry is detected on load and rebuilt.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

from . import knobs

log = logging.getLogger(__name__)


def digest(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
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


@contextmanager
def file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class KernelCache:
    def __init__(self, root: Optional[os.PathLike] = None):
        self.root = Path(root) if root else knobs.cache_dir() / "kernels"

    def entry(self, kernel_name: str, material: dict) -> tuple[Path, Path]:
        h = digest(dict(material, kernel=kernel_name))
        folder = self.root / kernel_name
        return folder / f"{h[:32]}.bin", folder / f"{h[:32]}.json"

    def load(self, kernel_name: str, material: dict) -> Optional[tuple[bytes, dict]]:
        bin_path, meta_path = self.entry(kernel_name, material)
        try:
            meta = json.loads(meta_path.read_text())
            blob = bin_path.read_bytes()
        except (OSError, json.JSONDecodeError):
            return None
        if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
            log.warning("cache entry %s is corrupted; rebuilding it", bin_path)
            return None
        return blob, meta

    def get_or_build(self, kernel_name: str, material: dict,
                     build: Callable[[], tuple[bytes, dict]]) -> tuple[bytes, dict, bool]:
        """Return ``(binary, metadata, was_hit)``; builds at most once across processes."""
        hit = self.load(kernel_name, material)
        if hit:
            return hit[0], hit[1], True
        bin_path, meta_path = self.entry(kernel_name, material)
        with file_lock(bin_path.with_suffix(".lock")):
            hit = self.load(kernel_name, material)  # another process may have built it
            if hit:
                return hit[0], hit[1], True
            blob, meta = build()
            meta = dict(meta, sha256=hashlib.sha256(blob).hexdigest(), kernel=kernel_name)
            _atomic_write(bin_path, blob)
            _atomic_write(meta_path, json.dumps(meta, indent=1, default=str).encode())
            return blob, meta, False

    def clear(self) -> int:
        """Delete every entry; returns the number of kernel folders removed."""
        if not self.root.exists():
            return 0
        n = sum(1 for p in self.root.iterdir() if p.is_dir())
        shutil.rmtree(self.root)
        return n

    def stats(self) -> dict:
        if not self.root.exists():
            return {"root": str(self.root), "kernels": 0, "entries": 0, "bytes": 0}
        entries = list(self.root.glob("*/*.bin"))
        return {"root": str(self.root), "kernels": len({p.parent for p in entries}),
                "entries": len(entries), "bytes": sum(p.stat().st_size for p in entries)}
