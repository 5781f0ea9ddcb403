"""Crash-safe file writes shared by every workload: a reader sees the old file or the new one, never a part.

Files get the mode a plain ``open(path, "w")`` would give them (0666 less the process umask, so 0644
by default): a model server or a pod running under another uid can read what a job wrote.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename inside it survives a crash once this returns)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder: fsync, rename, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _create_temp(path: Path) -> tuple[int, str]:
    """A new, exclusively created temp file beside ``path`` with mode 0666 (the kernel applies the umask,
    unlike tempfile.mkstemp's fixed 0600)."""
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
