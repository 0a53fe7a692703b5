"""Small filesystem helpers: every file the runbook writes goes through a temp file + rename; every file it
reads from a user is bounded (read_regular)."""
from __future__ import annotations

import json
import os
import stat as stat_mod
import tempfile
from pathlib import Path
from typing import Any

from runbook.core.errors import InputError


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write data to path atomically (temp file in the same dir, fsync, rename): a file already there is replaced
    whole or left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o644 & ~current_umask())  # 0644, or less under a stricter umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode)


def current_umask() -> int:
    """The process umask: from /proc (Linux), else by setting it (briefly 0077: a file created meanwhile is private)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_output(path: str | os.PathLike, text: str, option: str = "--out") -> Path:
    """A file the user named with `option`, written atomically; InputError naming the path and the fix."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{option} {p}: is a directory; give a file path (e.g. {option} {p / 'NAME'})")
    try:
        return atomic_write_text(p, text)
    except OSError as e:
        raise InputError(f"{option} {p}: cannot write there ({e.strerror or e}); give a path in a directory you can write") from None


def output_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """A directory the user named with `option`, created if missing and writable; InputError naming it and the fix."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"{option} {p}: not a directory (a file is in the way); give a directory, e.g. {option} outputs") from None
    except OSError as e:
        raise InputError(f"{option} {p}: cannot create it ({e.strerror or e}); give a directory you can write") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(f"{option} {p}: permission denied (this user cannot write there); give a directory you can write")
    return p


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


class FileRefused(ValueError):
    """Why a file was not read: `reason` is a phrase for "<path>: <reason>; <fix>" messages."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def read_regular(path: str | os.PathLike, cap: int, st: os.stat_result | None = None, what: str = "this file") -> bytes:
    """The bytes of a regular file of at most `cap` bytes (never reading more than cap + 1, so a file that grows
    or lies about its size is still bounded). FileRefused for a directory, a FIFO/socket/device, too large,
    or unreadable; FileNotFoundError passes through when `st` is not given."""
    st = st if st is not None else Path(path).stat()
    if stat_mod.S_ISDIR(st.st_mode):
        raise FileRefused("is a directory")
    if not stat_mod.S_ISREG(st.st_mode):
        raise FileRefused("not a regular file (a FIFO, socket or device)")
    if st.st_size > cap:
        raise FileRefused(f"{st.st_size:,} bytes is too large for {what} (at most {cap:,})")
    try:
        with open(path, "rb") as f:
            raw = f.read(cap + 1)
    except OSError as e:
        raise FileRefused(f"cannot read: {e.strerror or e}") from None
    if len(raw) > cap:
        raise FileRefused(f"larger than {cap:,} bytes, too large for {what}")
    return raw
