"""Crash-safe file writes: a reader sees the old file or the whole new one, never half."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `data` at once. `durable=False` skips the fsyncs: the file still
    survives the writer's crash (it is in the page cache), not the host's, which is enough for a
    file that is worthless after a reboot (a job's script, a pid)."""
    tmp = path.with_name(f".{path.name}.tmp")
    # A run's directory belongs to the job's owner: never write (as root) through a link they
    # planted at the temporary name. O_EXCL creates a new file or fails, following no link.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # on a full disk, what it got of the file is space it needs
        raise
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a power cut
    finally:
        os.close(dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data`: a write that runs out of space stores what fits and says nothing
    (the next one raises ENOSPC), and a file cut short must never replace a whole one."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
