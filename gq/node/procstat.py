"""A process's start time and state read straight from /proc (Linux), without psutil.

The launch path asks for these once or twice a job (gqnode names each shepherd by pid and start
time; the shepherd names its job the same way). psutil answers the same question but builds a
Process object, reads /proc/PID/stat twice and carries its own wrappers: a measurable share of
gqnode's CPU per job in the drain benchmark (issue 17). The value is psutil's exactly (start ticks
/ CLK_TCK + /proc/stat's btime, re-read each call as psutil does, so a wall-clock step shifts both
alike), so a start time recorded by either is compared with the other's within the 1 s tolerance
callers already allow.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses:
    the last ')' ends it). Index 0 is the state (field 3), index 19 the start time (field 22)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2:].split()


def _boot_time() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise OSError("no btime line in /proc/stat")


def create_time(pid: int) -> float:
    """When `pid` started, in seconds since the epoch (OSError if there is no such process)."""
    if pid <= 0:
        raise ProcessLookupError(pid)
    try:
        ticks = int(_stat_fields(pid)[19])
    except (IndexError, ValueError) as exc:
        raise OSError(f"/proc/{pid}/stat unreadable: {exc}") from exc
    return ticks / _TICKS + _boot_time()


def running(pid: int, started: float) -> bool:
    """Whether `pid` is the process that started at `started` (within 1 s) and not a zombie."""
    if pid <= 0:
        return False
    try:
        fields = _stat_fields(pid)
        ticks = int(fields[19])
    except (OSError, IndexError, ValueError):
        return False
    if abs(ticks / _TICKS + _boot_time() - started) >= 1.0:
        return False
    return fields[0] not in (b"Z", b"X")
