"""Where srun's tasks write, as Slurm's srun has it: to srun's own standard output and error.

The tasks run on the job's nodes, not under srun, and write to files (the file system is
shared, as for the job's own files). Without -o/-e: a stream of srun's that is a file is
named to the tasks, who append to it (the job's output file, usually); any other (a pipe, as
in `ip=$(srun hostname)` or `srun cmd | tee log`; a terminal) gets a relay file beside the
step's working directory that srun copies to the stream as it grows and removes at the end.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import IO


def _file_of(fd: int) -> str | None:
    """The path of the regular file open as `fd`, else None (a pipe, a terminal, deleted)."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        path = os.readlink(f"/proc/self/fd/{fd}")
        same = os.stat(path)
        return path if (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino) else None
    except OSError:
        return None


def _same(a: int, b: int) -> bool:
    try:
        x, y = os.fstat(a), os.fstat(b)
        return (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)
    except OSError:
        return False


class Relay:
    """A file the tasks append to and srun copies to one of its streams."""

    def __init__(self, cwd: str, stream: IO[bytes]):
        fd, self.path = tempfile.mkstemp(prefix=".srun-", suffix=".out", dir=cwd)
        self.file = os.fdopen(fd, "rb")
        self.stream = stream

    def pump(self) -> None:
        """Copy what the tasks wrote since the last pump."""
        while chunk := self.file.read(65536):
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(chunk)
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()

    def close(self) -> None:
        self.pump()
        self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def route(fields: dict[str, object], cwd: str, out: IO[bytes], err: IO[bytes]) -> list[Relay]:
    """Set the step's `output` and `error` (those srun was not given) to srun's streams: their
    files' paths, or relays (returned, to pump while the step runs and close at its end)."""
    relays: list[Relay] = []
    given_out, given_err = fields.get("output"), fields.get("error")
    if given_out is None:
        path = _file_of(out.fileno())
        if path is None:
            relays.append(Relay(cwd, out))
            path = relays[-1].path
        fields["output"] = path.replace("%", "%%")  # no patterns in a name found so
    if given_err is None and not (given_out is None and _same(out.fileno(), err.fileno())):
        path = _file_of(err.fileno())
        if path is None:
            relays.append(Relay(cwd, err))
            path = relays[-1].path
        fields["error"] = path.replace("%", "%%")
    return relays
