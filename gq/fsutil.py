"""Crash-safe file writes (a reader sees the old file or the whole new one, never half), and
directories with exactly the mode they need."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `data` at once. `durable=False` skips the fsyncs: the file still
    survives the writer's crash (it is in the page cache), not the host's, which is enough for a
    file that is worthless after a reboot (a job's script, a pid)."""
    tmp = temp_path(path)
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
    if durable:
        fsync_dir(path.parent)  # the rename itself must survive a power cut


def temp_path(path: Path) -> Path:
    """Where write_atomic writes `path` before the rename: a name of this process and thread,
    so that two writers of one file (the shepherds of two jobs starting at once on a node, each
    installing the node's Slurm commands) never take or rename each other's half-written file.
    One that dies leaves its file behind; the next write by the same name removes it."""
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}.tmp")


def fsync_dir(path: Path) -> None:
    """Make what was created, renamed or removed in directory `path` survive a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_durably(tmp: Path, path: Path) -> None:
    """fsync the complete file `tmp`, then rename it to `path`, durably: whole or not at all."""
    fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """Create `path` and its missing parents, each with exactly `mode` whatever the umask (gq's
    daemons run under 0077); directories that exist are left as they are."""
    for directory in (*reversed(path.parents), path):
        if not directory.exists():
            directory.mkdir(exist_ok=True)
            os.chmod(directory, mode)


def private_dir(path: Path, mode: int) -> None:
    """Create `path` if need be and give it exactly `mode` (0700, or 0711 where others must pass
    through but not list): a directory made by an older gq, or under a loose umask, is
    tightened. Missing parents get 0755, as before gq's daemons set a 0077 umask: a node's run
    directories below may have to be reached by their jobs' owners."""
    make_dirs(path.parent)
    path.mkdir(exist_ok=True, mode=mode)
    if path.stat().st_mode & 0o7777 != mode:
        os.chmod(path, mode)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data`: a write that runs out of space stores what fits and says nothing
    (the next one raises ENOSPC), and a file cut short must never replace a whole one."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
