"""srun -l/--label: every line a task writes goes to its file with the task's id in front
(`0: `, padded to the widest id of the step, as Slurm's ` 3: ` among twelve tasks).

Each labelled stream is a pipe that a small forked copier of the step shepherd reads to the
end: the task and whatever it leaves behind write to the pipe, the copier prefixes whole lines
(a last line without its newline keeps none) and appends them to the file, one write a batch
of lines, so that lines of tasks sharing a file never mix.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def prefix(procid: int, ntasks: int) -> bytes:
    return f"{procid:>{len(str(max(0, ntasks - 1)))}}: ".encode()


def start(out: int, label: bytes) -> tuple[int, int]:
    """A copier of a new pipe to `out` with `label` before each line: (the pipe's end for the
    task to write to, the copier's pid)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            # Only its two ends: another stream's pipe held open here would never see its end.
            for fd in range(3, _max_fd()):
                if fd not in (read, out):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            _copy(read, out, label)
        finally:
            os._exit(0)
    os.close(read)
    return write, pid


def _max_fd() -> int:
    try:
        return max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return 1024


def _copy(read: int, out: int, label: bytes) -> None:
    rest = b""
    while chunk := os.read(read, 65536):
        *lines, rest = (rest + chunk).split(b"\n")
        if lines:
            os.write(out, b"".join(label + line + b"\n" for line in lines))
    if rest:
        os.write(out, label + rest)


def finish(pids: list[int], timeout_s: float = 2.0) -> None:
    """Wait for the copiers to reach their pipes' ends (the tasks have ended), at most
    `timeout_s`: one whose pipe a leftover process still holds is killed. SIGCHLD must be
    blocked (the step shepherd's signals are)."""
    deadline = time.monotonic() + timeout_s
    left = set(pids)
    while left:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            left.discard(pid)
        if left and time.monotonic() > deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            return
        if left:  # until a copier ends (SIGCHLD: the step shepherd blocks it) or the time is up
            signal.sigtimedwait({signal.SIGCHLD}, max(0.0, deadline - time.monotonic()))
