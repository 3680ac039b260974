"""``ck build --preset NAME --out DIR --wheel WHEELDIR``: a built kernel set as an installable
distribution, ``ck-kernels-<arch>``, whose entries launches find read-only.

The wheel holds one package, ``ck_kernels_<arch>``, whose ``kernels/`` folder is a kernel-cache
root (the entries ``ck build`` wrote), and an entry point in the group
:data:`ck_core.cache.KERNEL_SETS_GROUP` naming that package; :func:`ck_core.cache.prebuilt_roots`
finds it without importing it.  Written directly as a zip (the wheel format is a zip with a
``.dist-info`` folder): no build backend, no network.  Links and anything but regular files
are left out.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from pathlib import Path
from typing import Optional

from . import __version__
from .cache import KERNEL_SETS_GROUP
from .errors import ConfigError


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(root: Path, arch: str, out_dir: Path, preset: Optional[str] = None,
                version: Optional[str] = None) -> Path:
    """Pack the kernel-cache root ``root`` (built for ``arch``) as ``ck_kernels_<arch>-<version>-py3-none-any.whl``
    in ``out_dir``; returns its path."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", arch):
        raise ConfigError(f"arch {arch!r}: a kernel set's arch is letters, digits and '_'")
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"no built kernel set at {root}; run ck build --preset ... --out first")
    out_dir.mkdir(parents=True, exist_ok=True)
    pkg, dist = f"ck_kernels_{arch.lower()}", f"ck-kernels-{arch.lower()}"
    version = version or __version__
    info = f"{pkg}-{version}.dist-info"
    files: list = []
    init = (f'"""Prebuilt ck-dispatcher kernels for {arch}' + (f" (preset {preset})" if preset else "")
            + ': a kernel-cache root in kernels/, found through the entry point '
            f'{KERNEL_SETS_GROUP} (never imported for it)."""\n').encode()
    files.append((f"{pkg}/__init__.py", init))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if p.is_symlink() or not p.is_file() or fn.startswith(".") or fn.endswith(".lock"):
                continue   # links, dead writers' temporaries and lock files are not the set
            files.append((f"{pkg}/kernels/{p.relative_to(root).as_posix()}", p.read_bytes()))
    meta = (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
            f"Summary: Prebuilt ck-dispatcher kernels for {arch}" + (f" (preset {preset})" if preset else "")
            + f"\nRequires-Dist: ck-core\n").encode()
    wheel = b"Wheel-Version: 1.0\nGenerator: ck-core\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    eps = f"[{KERNEL_SETS_GROUP}]\n{arch.lower()} = {pkg}\n".encode()
    files += [(f"{info}/METADATA", meta), (f"{info}/WHEEL", wheel), (f"{info}/entry_points.txt", eps)]
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files) + f"{info}/RECORD,,\n"
    path = out_dir / f"{pkg}-{version}-py3-none-any.whl"
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(n, d)
        z.writestr(f"{info}/RECORD", record)
    os.replace(tmp, path)
    return path


#: the most one unpacked kernel set may take (a damaged or hostile archive must not fill the disk)
MAX_UNPACKED_BYTES = 4 << 30


def unpack_wheel(wheel: Path, dest: Path) -> Path:
    """Extract the kernel-cache root of a ``ck-kernels-<arch>`` wheel (:func:`write_wheel`) into
    ``dest``; returns the root (``dest/<package>/kernels``), to name in ``CK_KERNEL_SETS``.

    Only regular files under ``<package>/kernels/`` whose path parts are plain names are written
    (no absolute paths, ``..``, links or other members), nothing outside ``dest``, at most
    :data:`MAX_UNPACKED_BYTES` in all; anything else in the archive is a ConfigError."""
    wheel, dest = Path(wheel), Path(dest)
    try:
        z = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{wheel}: not a kernel-set wheel ({type(exc).__name__}: {exc}); "
                          "give the .whl that `ck build --preset ... --wheel DIR` wrote") from None
    with z:
        members = [m for m in z.infolist() if re.fullmatch(r"ck_kernels_[a-z0-9_]+/kernels/.+", m.filename)]
        if not members:
            raise ConfigError(f"{wheel}: no ck_kernels_<arch>/kernels/ entries; give a wheel written by "
                              "`ck build --preset ... --wheel DIR`")
        pkgs = {m.filename.split("/")[0] for m in members}
        if len(pkgs) != 1:
            raise ConfigError(f"{wheel}: kernels of several packages {sorted(pkgs)}; one set per wheel")
        total = 0
        for m in members:
            parts = m.filename.split("/")
            mode = (m.external_attr >> 16) & 0o170000
            if m.is_dir():
                continue
            if any(p in ("", ".", "..") or "\\" in p for p in parts) or (mode and mode != 0o100000):
                raise ConfigError(f"{wheel}: member {m.filename!r} is not a plain file path; not unpacked")
            total += m.file_size
            if total > MAX_UNPACKED_BYTES:
                raise ConfigError(f"{wheel}: more than {MAX_UNPACKED_BYTES >> 20} MiB unpacked; not a kernel set")
        dest.mkdir(parents=True, exist_ok=True)
        for m in members:
            if m.is_dir():
                continue
            out = dest.joinpath(*m.filename.split("/"))
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(m) as src, open(out, "wb") as f:
                f.write(src.read(m.file_size + 1)[: m.file_size])
    return dest / pkgs.pop() / "kernels"
