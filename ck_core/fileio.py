"""Reading the files the project is given: regular files only, bounded, with errors that say what to do.

Every file ck-dispatcher reads on a user's behalf (registry JSON, tuned-data
stores, kernel-set configs, filter files, testing matrices, sweep resume files, ranker models,
oracles) is read through :func:`read_bytes` / :func:`read_text` / :func:`read_json`:

* the file is opened with ``O_NONBLOCK`` and checked with ``fstat`` *on the open descriptor*
  before a byte is read, so a FIFO never blocks, a character device (``/dev/zero``) is never read
  until memory runs out, a directory is named as one, and a symlink to any of these is caught too
  (and nothing can swap the file between the check and the read);
* at most ``limit`` bytes are read (a per-kind limit, :data:`LIMITS`): a larger file is refused by
  name, never loaded;
* text is UTF-8 without NUL bytes; JSON nests at most :data:`MAX_DEPTH` levels (a deeper text
  is refused where the parser stops, never as a crash).

Every refusal is a :class:`~ck_core.errors.ConfigError` (or the class the caller passes) naming
the file and what to do about it.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional, Type

from .errors import CkError, ConfigError

MiB = 1 << 20
#: most bytes each kind of file may hold; a larger one is not a file this project wrote
LIMITS = {
    "config": 4 * MiB,          # kernel-set TOML/JSON, seed configs, testing matrices
    "filter": 1 * MiB,          # filter files: one expression per line
    "registry": 256 * MiB,      # `ck export` registries (tens of thousands of keys)
    "tuned": 64 * MiB,          # one (op, arch) tuned-data file (tables, rankers)
    "resume": 512 * MiB,        # a sweep's partial rows / CSV / JSON being resumed
    "oracle": 256 * MiB,        # a recorded selection oracle (compressed or not)
}
#: deeper nesting than any file this project writes; bounds parsers' and readers' recursion
MAX_DEPTH = 64

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _limit(limit) -> int:
    return LIMITS[limit] if isinstance(limit, str) else int(limit)


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n} bytes"


def read_bytes(path, what: str = "file", limit="config", error: Type[CkError] = ConfigError,
               hint: str = "") -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``: a byte count or a key of
    :data:`LIMITS`); ``error`` naming ``what`` and ``path`` for anything else.  ``hint`` ends
    the message (what the user should do)."""
    p = Path(path)
    cap = _limit(limit)
    tail = f"; {hint}" if hint else ""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}{tail}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {p} is {_kind(st.st_mode)}, not a regular file"
                        f"{tail or '; pass the path of a regular file'}")
        if st.st_size > cap:
            raise error(f"{what} {p} is {_size(st.st_size)}, more than the {_size(cap)} such a file may "
                        f"hold; is it the right file?{tail}")
        chunks, got = [], 0
        while got <= cap:   # st_size can lie (a file growing, /proc): read at most cap + 1 bytes
            try:
                chunk = os.read(fd, min(cap + 1 - got, 1 << 22))
            except BlockingIOError:  # pragma: no cover - regular files do not block
                continue
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > cap:
            raise error(f"{what} {p} is larger than the {_size(cap)} such a file may hold; is it the "
                        f"right file?{tail}")
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}{tail}") from None
    finally:
        os.close(fd)


def decode(raw: bytes, path, what: str = "file", error: Type[CkError] = ConfigError, hint: str = "") -> str:
    """``raw`` as UTF-8 text without NUL bytes (a leading byte-order mark is dropped)."""
    tail = f"; {hint}" if hint else ""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}); is it a binary file?{tail}") from None
    if "\x00" in text:
        raise error(f"{what} {path} holds NUL bytes; is it a binary file?{tail}")
    return text


def read_text(path, what: str = "file", limit="config", error: Type[CkError] = ConfigError,
              hint: str = "") -> str:
    """The UTF-8 text of the regular file ``path`` (see :func:`read_bytes`)."""
    return decode(read_bytes(path, what, limit, error, hint), path, what, error, hint)


def depth_error(data, max_depth: int = MAX_DEPTH) -> Optional[str]:
    """Why ``data`` (parsed JSON/TOML) nests too deeply, or None."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return f"nests objects/arrays deeper than {max_depth} levels"
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return None


def loads_json(text: str, path, what: str = "file", error: Type[CkError] = ConfigError, hint: str = "",
               max_depth: int = MAX_DEPTH, allow_nan: bool = True) -> Any:
    """``text`` parsed as JSON with its nesting bounded (and, unless ``allow_nan``, no NaN or
    Infinity); ``error`` naming the file otherwise."""
    tail = f"; {hint}" if hint else ""

    def no_constant(name):
        raise ValueError(f"{name} is not a finite JSON number")

    try:
        data = json.loads(text, parse_constant=None if allow_nan else no_constant)
    except RecursionError:   # the C scanner counts its depth against the recursion limit
        raise error(f"{what} {path} nests objects/arrays too deeply to parse{tail}") from None
    except ValueError as exc:
        raise error(f"{what} {path} is not valid JSON: {str(exc)[:200]}{tail}") from None
    why = depth_error(data, max_depth)
    if why:
        raise error(f"{what} {path} {why}{tail}")
    return data


def read_json(path, what: str = "file", limit="config", error: Type[CkError] = ConfigError, hint: str = "",
              max_depth: int = MAX_DEPTH, allow_nan: bool = True) -> Any:
    """The JSON document in the regular file ``path``: bounded size, UTF-8, bounded nesting."""
    return loads_json(read_text(path, what, limit, error, hint), path, what, error, hint, max_depth, allow_nan)
