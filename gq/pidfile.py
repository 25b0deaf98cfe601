"""Pid files held under an flock for the daemon's lifetime, so "is it running" never trusts a stale pid."""

from __future__ import annotations

import fcntl
import os

from gq.errors import GqError

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:  # `gq submit` asks read_alive without loading pathlib
    from pathlib import Path


class AlreadyRunning(GqError):
    """Another daemon holds this pid file's lock."""


def acquire(path: Path) -> int:
    """Lock `path` and write our pid into it; the returned fd must stay open while we run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"another process holds {path} (pid {_read(path)})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def read_alive(path: Path | str) -> int | None:
    """The pid of the live daemon holding `path`, or None when nobody holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(path)
    finally:
        os.close(fd)
    return None


def _read(path: Path | str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None
