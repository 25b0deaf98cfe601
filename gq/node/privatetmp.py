"""A private /tmp per job (`[node] private_tmp`, like Slurm's job_container/tmpfs).

The job gets its own directory, `STATE_DIR/tmp/J.R` (owned by its user, mode 0700), mounted on
/tmp in a mount namespace of its own: the shepherd unshares its mount namespace, makes every
mount a slave (nothing mounted inside leaks out; what the host mounts later, autofs homes say,
still comes in), bind-mounts the directory on /tmp, starts the job, and goes back to the host's
namespace, which it needs for its own files. The namespace lives as long as the job's processes;
the shepherd removes the directory at the job's end (gqnode those of shepherds that died).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Iterator
from typing import Any

from gq.node.cgroupfs import SetupError

_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_SLAVE = 1 << 19
TMP = "/tmp"


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(err, f"private /tmp: {what}: {os.strerror(err)}")


def make(path: str, uid: int, gid: int) -> None:
    """The job's directory, empty and its user's (SetupError if the node cannot make it)."""
    try:
        shutil.rmtree(path, ignore_errors=True)  # a crashed run's, of the same name
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
        os.chown(path, uid, gid)
    except OSError as exc:
        raise SetupError(exc.errno, f"private /tmp: cannot make {path}: {exc}") from None


@contextlib.contextmanager
def entered(path: str) -> Iterator[None]:
    """Inside, this process has `path` on /tmp in a mount namespace of its own (so do the
    processes it starts); it is back in its old namespace after."""
    libc = _libc()
    host = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    cwd = os.open(".", os.O_RDONLY | os.O_CLOEXEC)  # setns moves us to the namespace's root
    try:
        _check(libc.unshare(_CLONE_NEWNS), "unshare")
        try:
            _check(libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "mount --make-rslave /")
            _check(libc.mount(path.encode(), TMP.encode(), None, _MS_BIND, None),
                   f"bind {path} on {TMP}")
            yield
        finally:
            # setns needs a single-threaded caller that shares no fs_struct: the shepherd is.
            _check(libc.setns(host, _CLONE_NEWNS), "back to the host's mount namespace")
            os.fchdir(cwd)
    finally:
        os.close(host)
        os.close(cwd)


def remove(path: str) -> None:
    """Remove the job's directory (its user's files: rmtree does not follow their links)."""
    shutil.rmtree(path, ignore_errors=True)
