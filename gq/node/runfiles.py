"""The files of a job run's directory (jobs/J.R on its node) and the record in it: what the
shepherd writes and gqnode reads (to adopt a run, to report its end), and how both read and write
them safely in a directory the job's owner may write to."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from gq.fsutil import write_atomic
from gq.messages import Launch
from gq.node import procstat

#: The run's order (RunOrder), written by gqnode before the run's directory exists.
LAUNCH_FILE = "launch.msg"
#: The run's record, one line a fact, appended as each is known: "shepherd PID START" (gqnode,
#: for adoption), "job PID START" (the job's session is killed if the shepherd dies without a
#: status) and "status JSON" (durable). One file appended to, not a file a fact: creating a file
#: costs ~0.3 ms of kernel CPU here (an ext4 inode), an append next to nothing.
RECORD_FILE = "run"
#: Where gqnodes before the record kept the status, the shepherd's pid and the job's: runs they
#: started may still be adopted.
STATUS_FILE = "status.json"
PID_FILE = "shepherd.pid"
JOB_PID_FILE = "job.pid"
STOP_FILE = "stop.json"
LOG_FILE = "shepherd.log"


def open_ours(path: Path, flags: int) -> int:
    """Open a file in the run's directory for writing as gqnode's user. The directory may be
    the job owner's: no link is followed (nor a FIFO waited on), and a file they put there
    instead of ours is refused."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path} is not gqnode's")
    return fd


def record(run_dir: Path, tag: str, text: str, durable: bool = False) -> None:
    """Append the fact `tag text` to the run's record (a single write of one line: appends by
    gqnode and the shepherd never mix). `durable`: on disk, and the record in its directory,
    before this returns."""
    fd = open_ours(run_dir / RECORD_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    line = f"{tag} {text}\n".encode()
    try:
        end = os.fstat(fd).st_size
        try:
            if os.write(fd, line) != len(line):  # out of space part-way: ENOSPC comes next
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_dir / RECORD_FILE))
        except OSError:
            os.ftruncate(fd, end)  # no half line for the next append to run on from
            raise
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if durable:
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # a record created by this append must survive a power cut too
        finally:
            os.close(dir_fd)


def read_record(run_dir: Path) -> dict[str, str]:
    """The run's facts, tag -> text (the last line of each tag; a line cut short by a crash is
    not one); {} if there is no record we wrote."""
    try:
        text = read_trusted(run_dir / RECORD_FILE)
    except (OSError, UnicodeDecodeError):
        return {}
    facts = {}
    for line in text.split("\n")[:-1]:
        tag, _, rest = line.partition(" ")
        facts[tag] = rest
    return facts


def read_pid(run_dir: Path, tag: str, legacy: str) -> tuple[int, float]:
    """(pid, start time) the record holds for `tag` ("shepherd" or "job"), else what the file
    `legacy` of an older gqnode does; (0, 0.0) if neither."""
    text = read_record(run_dir).get(tag)
    try:
        if text is None:
            text = (run_dir / legacy).read_text()
        pid, started = text.split()
        return int(pid), float(started)
    except (OSError, ValueError):
        return 0, 0.0


def read_trusted(path: Path) -> str:
    """A file only we (gqnode's user) can have written: the run's directory belongs to the job's
    owner, who must not be able to order a longer grace or no signal for their own job."""
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:  # no FIFO waits
        if os.fstat(f.fileno()).st_uid != os.geteuid():
            raise PermissionError(f"{path} is not gqnode's")
        return f.read()


def read_status(run_dir: Path) -> dict[str, Any] | None:
    text = read_record(run_dir).get("status")
    try:
        if text is None:  # a shepherd of an older gqnode
            text = (run_dir / STATUS_FILE).read_text()
        return json.loads(text)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunOrder:
    """What a run's shepherd starts from, its launch file: the launch gqd sent, how gqnode
    confines the run and where the job's gq commands reach gqd. On disk one map: the launch's
    wire fields, `isolation` and `relay` (gq.node.isolation reads its plan from it too)."""

    launch: Launch
    #: gq.node.isolation's plan for the run (cgroup, limits, /tmp); {}: none.
    isolation: dict[str, Any]
    #: This node's relay endpoint (the job's GQ_ENDPOINT); "": the job reaches gqd directly.
    relay: str = ""
    #: Whether the job's --cache-key was warm on its GPUs here (GQ_CACHE_WARM); None: no key.
    cache_warm: bool | None = None


def write_order(path: Path, order: RunOrder) -> None:
    """The run's order, readable by gqnode's user only (the job's environment: its secrets).
    No fsync: it only matters while this boot's shepherd lives."""
    body = {**order.launch.wire(), "isolation": order.isolation}
    if order.relay:
        body["relay"] = order.relay
    if order.cache_warm is not None:
        body["cache_warm"] = order.cache_warm
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(msgpack.packb(body, use_bin_type=True))


def read_order(run_dir: Path) -> RunOrder:
    """The order gqnode wrote for the run (a shepherd's first read)."""
    data = msgpack.unpackb((run_dir / LAUNCH_FILE).read_bytes(), raw=False)
    warm = data.get("cache_warm")
    return RunOrder(Launch.from_wire(data), dict(data.get("isolation") or {}),
                    str(data.get("relay") or ""), warm if isinstance(warm, bool) else None)


def proc_start(pid: int) -> float:
    """When process `pid` started (0.0 if it is gone): with its pid, what names a shepherd
    (a recycled pid is another process, started later)."""
    try:
        return procstat.create_time(pid)
    except OSError:
        return 0.0


def alive(pid: int, started: float) -> bool:
    """Whether the process `pid` that started at `started` still runs (not a zombie)."""
    return procstat.running(pid, started)


def order_stop(run_dir: Path, signal_name: str, batch_only: bool, grace_s: float | None,
               no_kill: bool = False, reason: str = "") -> None:
    """Tell a run's shepherd how its next SIGTERM is to stop the job (gqnode, before the SIGTERM).

    A signal carries no data, and the shepherd may be one that a restarted gqnode adopted (not its
    child, no pipe to it). A file in the run's directory outlives both and is the simplest channel
    that works for either. It is written whole (atomic rename) before the SIGTERM is sent, and the
    shepherd reads it only on a SIGTERM, so it never sees half an order or acts on none.
    """
    order: dict[str, Any] = {"signal": signal_name, "batch_only": batch_only, "grace_s": grace_s}
    if no_kill:
        order["no_kill"] = True
    if reason:  # gqnode's own stop (its head lease ran out): the run ends NODE_FAIL with it
        order["reason"] = reason
    write_atomic(run_dir / STOP_FILE, json.dumps(order).encode(), mode=0o600)


def stop_reason(run_dir: Path) -> str:
    """Why gqnode itself stopped the run (`order_stop`'s reason), "" if it did not."""
    try:
        reason = json.loads(read_trusted(run_dir / STOP_FILE)).get("reason")
    except (OSError, ValueError, AttributeError):
        return ""
    return reason if isinstance(reason, str) else ""
