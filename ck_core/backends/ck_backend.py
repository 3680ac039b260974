"""The ck backend: CK Tile C++ instances compiled with hipcc, called through ctypes.

For ROCm users.  The op plugin renders a key into a C++ translation unit
(``OpSpec.render(key, "ck")`` -> object with ``source``, ``source_hash``,
``symbol``); this backend writes it into the cache and, when a HIP toolchain
is present, compiles it to a shared object for the arch.  Where no hipcc is
found (as on a CPU-only or NVIDIA machine) the source is still written, and
the error says plainly where it is and what is missing.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from .. import __version__, knobs
from ..cache import atomic_write, digest, ensure_folder, remove_path, sweep_orphans
from ..errors import CompileError, ToolchainMissing
from ..hookspecs import hookimpl
from ..records import BackendSpec

log = logging.getLogger(__name__)

#: a hipcc output this old is a killed build's (CK Tile compiles take minutes, not hours)
_HIPCC_ORPHAN_SECONDS = 3 * 3600


def hipcc() -> Optional[str]:
    root = knobs.get("CK_ROCM_PATH") or os.environ.get("ROCM_PATH") or "/opt/rocm"
    found = shutil.which("hipcc") or (str(Path(root) / "bin" / "hipcc")
                                      if (Path(root) / "bin" / "hipcc").exists() else None)
    return found


def ck_include() -> Optional[str]:
    inc = knobs.get("CK_TILE_INCLUDE")
    if inc and (Path(inc) / "ck_tile").is_dir():
        return inc
    root = knobs.get("CK_ROCM_PATH") or os.environ.get("ROCM_PATH") or "/opt/rocm"
    cand = Path(root) / "include"
    return str(cand) if (cand / "ck_tile").is_dir() else None


def available():
    cc = hipcc()
    if cc is None:
        return False, ("no HIP toolchain: hipcc was not found on PATH or under CK_ROCM_PATH "
                       "(install ROCm 6.x with composable_kernel to compile CK Tile kernels; "
                       "sources are still generated)")
    if ck_include() is None:
        return False, "hipcc found but no ck_tile headers; set CK_TILE_INCLUDE to composable_kernel/include"
    return True, cc


def can_execute(arch):
    ok, why = available()
    if not ok:
        return False, why
    if arch.vendor != "amd":
        return False, f"the ck backend runs on AMD GPUs only, not {arch.name}"
    try:
        import torch
        if getattr(torch.version, "hip", None) and torch.cuda.is_available():
            here = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
            if here == arch.name:
                return True, ""
            return False, f"the GPU here is {here}, not {arch.name}"
    except ImportError:
        pass
    return False, "no ROCm GPU visible (torch with ROCm is used to detect it)"


def source_dir(cache_root=None) -> Path:
    return Path(cache_root) if cache_root else knobs.cache_dir() / "ck-src"


def _folder(key, rendered, arch, cache_root) -> Path:
    """The entry folder of a key's source and library: named by a hash, never by the key's text.

    Where the cache cannot be written, a private temporary folder (with a warning)."""
    h = digest({"kernel": key.name, "source": rendered.source_hash, "arch": arch.name, "core": __version__})
    root = source_dir(cache_root)
    folder = root / h[:2] / h[:40]
    if folder.parent.exists() and not folder.parent.is_dir():
        remove_path(folder.parent)   # damage inside the cache
    if folder.exists() and not folder.is_dir():
        remove_path(folder)
    if ensure_folder(folder, "ck source folder", report=root):
        return folder
    return Path(tempfile.mkdtemp(prefix="ck-src-"))


def compile_key(key, op, arch, opts: dict) -> dict:
    if op.render is None:
        raise CompileError(f"op {op.name} has no CK Tile templates")
    rendered = op.render(key, "ck")
    folder = _folder(key, rendered, arch, opts.get("cache_root"))
    src, lib, record = folder / "kernel.cpp", folder / "kernel.so", folder / "kernel.json"
    sweep_orphans(folder, _HIPCC_ORPHAN_SECONDS)
    if not src.is_file() or src.read_bytes() != rendered.source.encode():
        remove_path(src)
        remove_path(lib)         # a library of another source is stale
        atomic_write(record, json.dumps({"kernel": key.name, "arch": arch.name,
                                         "source_sha256": rendered.source_hash}, indent=1).encode())
        atomic_write(src, rendered.source.encode())
    ok, why = available()
    if not ok:
        raise ToolchainMissing(f"{why}. The CK Tile source for {key.name} is at {src}; on a ROCm "
                               f"machine, `ck build --backend ck` compiles it with hipcc "
                               f"--offload-arch={arch.name}")
    if lib.is_file() and not opts.get("force"):
        return {"source": str(src), "library": str(lib), "cache_hit": True}
    remove_path(lib)
    tmp = folder / f".tmp-{os.getpid()}-kernel.so"
    cmd = [hipcc(), "-O3", "-std=c++20", "-shared", "-fPIC", f"--offload-arch={arch.name}",
           f"-I{ck_include()}", str(src), "-o", str(tmp)]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        remove_path(tmp)
        raise CompileError(f"hipcc failed for {key.name} ({src}):\n{res.stderr[-2000:]}")
    os.replace(tmp, lib)
    return {"source": str(src), "library": str(lib), "cache_hit": False,
            "compile_seconds": round(time.perf_counter() - t0, 2), "core": __version__}


def _to_numpy(x):
    from .numpy_backend import _to_numpy as f

    return f(x)


@hookimpl
def ck_register_backends():
    return [BackendSpec(
        name="ck", available=available, can_execute=can_execute,
        to_backend=lambda x: x, to_numpy=_to_numpy, compile=compile_key,
        description="CK Tile C++ instances built with hipcc (ROCm); generates sources anywhere",
    )]
