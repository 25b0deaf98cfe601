"""Whether gqnode's state disk can take another job, and room kept for each run's record.

Jobs filling a disk is ordinary; losing their finished work to it is not. A node whose state
disk is full (a write there failed for want of space, or it has under NODE_MIN_FREE_BYTES free)
takes no new jobs: its heartbeats say so and gqd drains it, and lifts that drain itself once the
disk has room again and every report is written. Its running jobs go on, and their ends still
reach gqd: each run's record has its room reserved when the run is created (`reserve`), so the
shepherd can write the final status on a full disk, and the outbox keeps in memory what it
cannot write.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from pathlib import Path
from typing import Any

from gq import defaults
from gq.units import format_size

log = logging.getLogger("gq.node")

#: Errors that mean the disk is full (a quota counts as full).
SPACE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FALLOC_FL_KEEP_SIZE = 1


def _fallocate() -> Any:
    """fallocate(2), or None where the C library has none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return call


_FALLOCATE = _fallocate()


def reserve(path: Path, size: int) -> None:
    """Create the empty file `path` with `size` bytes of disk set aside for it (its size stays
    0: appends fill them). OSError ENOSPC if the disk has not that much; on a file system that
    cannot reserve, the file is only created."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if _FALLOCATE is not None and _FALLOCATE(fd, _FALLOC_FL_KEEP_SIZE, 0, size) != 0:
            code = ctypes.get_errno()
            if code in SPACE_ERRORS:
                raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)


class StateDisk:
    """The state disk's verdict: `problem` is why it cannot take a job ("" when it can)."""

    def __init__(self, path: Path, min_free: int = defaults.NODE_MIN_FREE_BYTES):
        self.path, self.min_free = path, min_free
        self.problem = ""
        #: Free bytes it takes to have room again: min_free, or min_free more than there were
        #: when a write failed (one bigger than min_free, a big launch, would fail again).
        self.need = min_free
        self.check(writes_ok=True)

    def failed(self, exc: OSError) -> bool:
        """A write to the state disk failed: True if for want of space (the disk is full now)."""
        if exc.errno not in SPACE_ERRORS:
            return False
        self.need = max(self.need, self._free() + self.min_free)
        self._set(self.problem or f"{os.strerror(exc.errno)} on {self.path}")
        return True

    def check(self, writes_ok: bool) -> bool:
        """Look at the free space (each heartbeat); `writes_ok`: nothing waits to be written.
        True when `problem` changed."""
        free = self._free()
        if free < self.min_free:
            return self._set(self.problem or f"under {format_size(self.min_free)} free on "
                             f"{self.path}")
        if free < self.need or not writes_ok:
            return False
        self.need = self.min_free
        return self._set("")

    def _free(self) -> int:
        try:
            st = os.statvfs(self.path)
        except OSError:
            return self.min_free  # cannot tell: writes will
        return st.f_bavail * st.f_frsize

    def _set(self, problem: str) -> bool:
        if problem == self.problem:
            return False
        if problem:
            log.error("node state disk full: %s; this node takes no new jobs until it has room "
                      "(running jobs go on)", problem)
        else:
            log.info("node state disk has room again: this node takes jobs again")
        self.problem = problem
        return True
