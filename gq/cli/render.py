"""Everything the CLI prints: tables (rich on a terminal, plain aligned text otherwise), JSON.

Data goes to stdout, messages to stderr. Off a terminal nothing is truncated or coloured, so
scripts can parse it; rich is imported only when a terminal will see it.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Sequence

from gq.arrays import fold
from gq.jsontext import pretty as _pretty
from gq.units import format_duration, format_size, parse_iso_time

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any

#: Version of the `--json` documents; bumped only when a field changes meaning or goes away.
JSON_SCHEMA_VERSION = 1

_STATE_SHORT = {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F",
                "CANCELLED": "CA", "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR",
                "OUT_OF_MEMORY": "OOM"}


def message(text: str) -> None:
    print(f"gq: {text}", file=sys.stderr)


def emit_json(data: Any) -> None:
    """`data` as `json.dumps(data, indent=2)` writes it, made faster (a listing of ten
    thousand jobs is a third of a million values)."""
    _write(_pretty(data, "") + "\n")


def emit_jobs_json(texts: list[bytes]) -> None:
    """The `--json` listing document (emit_json's of {"schema_version", "jobs"}) from each
    job's text as gqd keeps it, ASCII at the jobs' depth already (gq/head/records.py: `texts`):
    joined as they are, the client neither decodes records nor writes their JSON."""
    jobs = b"[\n" + b",\n".join(texts) + b"\n  ]" if texts else b"[]"
    doc = b'{\n  "schema_version": %d,\n  "jobs": %b\n}\n' % (JSON_SCHEMA_VERSION, jobs)
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a stdout of text only (one put in place of the real one)
        _write(doc.decode("ascii"))
        return
    sys.stdout.flush()
    for start in range(0, len(doc), _PIECE):  # a piece at a time: see `_write`
        out.write(doc[start:start + _PIECE])


#: Characters written to stdout at a time (see `_write`).
_PIECE = 1 << 16


def _write(text: str) -> None:
    """Write to stdout a piece at a time: with PYTHONUNBUFFERED, one short write of a large
    text to a pipe whose reader has gone is not an error, and `gq queue | head` would end 0."""
    for start in range(0, len(text), _PIECE):
        sys.stdout.write(text[start:start + _PIECE])


#: `gq --color WHEN`: "auto" (colour on a terminal unless $NO_COLOR is set), "always" (rich
#: tables with colour even into a pipe, despite $NO_COLOR) or "never".
COLOR_MODES = ("auto", "always", "never")
color_mode = "auto"


def _is_tty() -> bool:
    return sys.stdout.isatty()


def terminal() -> bool:
    """stdout is a terminal a person looks at ($GQ_PLAIN asks for plain text all the same)."""
    return _is_tty() and not os.environ.get("GQ_PLAIN")


def colour() -> bool:
    if color_mode != "auto":
        return color_mode == "always"
    return terminal() and not os.environ.get("NO_COLOR")


def console() -> Any:
    """A rich console for stdout as --color and $NO_COLOR say; off a terminal (--color
    always) as wide as the data, so nothing is cut."""
    from rich.console import Console
    return Console(color_system="auto" if colour() else None, highlight=False,
                   force_terminal=True if color_mode == "always" else None,
                   width=None if _is_tty() else 100_000)


#: Tables longer than this are printed as plain text on a terminal too: rich's layout costs
#: about a millisecond a row, and nobody reads so many rows fitted to the screen.
RICH_MAX_ROWS = 1000


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if (terminal() or color_mode == "always") and len(cells) <= RICH_MAX_ROWS:
        from rich.table import Table
        t = Table(box=None, header_style="bold", pad_edge=False)
        for h in headers:
            t.add_column(h, no_wrap=True)
        for row in cells:
            t.add_row(*row)
        console().print(t)
        return
    widths = [max(map(len, column)) for column in zip(headers, *cells)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    head = line.format(*headers).rstrip()
    _write((f"\x1b[1m{head}\x1b[0m" if colour() else head) + "\n"
           + "".join(line.format(*row).rstrip() + "\n" for row in cells))


def parsable(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """`--parsable` (sacct's `-p`): a header line, then a line per row, fields between '|'.
    A value's own '|' or line break would split its line: they are written as '/' and a space
    (`one_line`; --json keeps them)."""
    for row in [list(headers), *rows]:
        cells = ["" if c is None else str(c) for c in row]
        line = "|".join(cells)
        if line.count("|") != len(cells) - 1 or "\n" in line or "\r" in line:
            line = "|".join(map(one_line, cells))  # (rare: checked on the whole line first)
        print(line)


def one_line(text: str) -> str:
    """A value for a '|'-separated line: its '|' as '/', its line breaks as spaces."""
    return text.replace("|", "/").replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def listing(headers: Sequence[str], rows: Sequence[Sequence[Any]], as_parsable: bool) -> None:
    (parsable if as_parsable else table)(headers, rows)


def elapsed(job: dict[str, Any], now: float | None = None) -> str:
    start = parse_iso_time(job.get("start_time"))
    if start is None:
        return "0:00"
    end = parse_iso_time(job.get("end_time")) or (now or time.time())
    return format_duration(max(1, int(end - start)))


#: The job fields `queue_rows` and `start_rows` read (gqd sends only these for a table).
QUEUE_FIELDS = ("id", "job_id", "name", "user", "qos", "state", "reason", "start_time",
                "end_time", "time_limit_s", "nodes", "gpus_per_node", "node_list",
                "array_job_id", "array_index", "array_task_limit")
START_FIELDS = ("id", "job_id", "name", "user", "state", "reason", "array_job_id",
                "array_index", "array_task_limit")


def queue_rows(jobs: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    headers = ["JOBID", "NAME", "USER", "QOS", "ST", "TIME", "TIME_LIMIT", "NODES", "GPUS",
               "NODELIST(REASON)"]
    rows = []
    for j, job_id in fold_pending_tasks(jobs):
        # Squeue's last column: the reason while pending, the nodes once it has run.
        if j["state"] == "PENDING":
            where = f"({j['reason'] or 'None'})"
        else:
            where = ",".join(j["node_list"]) or "-"
        rows.append([job_id, j["name"], j["user"], j["qos"], _STATE_SHORT.get(j["state"], j["state"]),
                     elapsed(j), _limit(j["time_limit_s"]), j["nodes"],
                     j["gpus_per_node"] * j["nodes"], where])
    return headers, rows


#: A queue has few distinct time limits: each is formatted once.
_limit = functools.lru_cache(maxsize=256)(format_duration)


def start_rows(jobs: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """`gq queue --start` (squeue --start): pending jobs, soonest expected start first; those
    the scheduler has no reservation for (N/A) last, an array's folded as in `queue_rows`."""
    headers = ["JOBID", "NAME", "USER", "ST", "START_TIME", "NODES", "REASON"]
    known = sorted((j for j in jobs if j.get("expected_start")),
                   key=lambda j: (j["expected_start"], j["id"]))
    unknown = fold_pending_tasks([j for j in jobs if not j.get("expected_start")])
    rows = [[job_id, j["name"], j["user"], _STATE_SHORT.get(j["state"], j["state"]),
             j.get("expected_start") or "N/A", ",".join(j.get("expected_nodes") or []) or "-",
             j["reason"] or "None"]
            for j, job_id in [*((j, j.get("job_id") or str(j["id"])) for j in known), *unknown]]
    return headers, rows


def fold_pending_tasks(jobs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(job, JOBID) rows as squeue shows them: an array's pending tasks as one row
    `123_[8-99%10]` where the first of them would be; every other job (or task) on its own."""
    pending: dict[int, list[dict[str, Any]]] = {}
    rows: list[tuple[dict[str, Any], Any]] = []
    for j in jobs:
        array_id = j.get("array_job_id")
        if array_id is None or j["state"] != "PENDING":
            rows.append((j, j.get("job_id") or str(j["id"])))
        elif array_id in pending:
            pending[array_id].append(j)
        else:
            pending[array_id] = [j]
            rows.append((j, array_id))  # resolved below, once all its tasks are seen
    out = []
    for j, job_id in rows:
        if isinstance(job_id, int):
            tasks = pending[job_id]
            limit = f"%{j['array_task_limit']}" if j.get("array_task_limit") else ""
            job_id = f"{job_id}_{tasks[0]['array_index']}" if len(tasks) == 1 and not limit \
                else f"{job_id}_[{fold(t['array_index'] for t in tasks)}{limit}]"
        out.append((j, job_id))
    return out


def show_job(job: dict[str, Any]) -> None:
    """`scontrol show job` style: Key=Value pairs, a few to a line."""
    line: list[str] = []
    for key, value in job_fields(job):
        line.append(f"{key}={'(null)' if value is None else value}")
        if len(line) == 4:
            print("   " + " ".join(line))
            line = []
    if line:
        print("   " + " ".join(line))


def cpu_time(seconds: float | None) -> str | None:
    """sacct's TotalCPU form: MM:SS.mmm under an hour, [D-]HH:MM:SS from there; None: unknown."""
    if seconds is None:
        return None
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes):02d}:{rest:06.3f}"
    return format_duration(seconds)


def job_fields(job: dict[str, Any]) -> list[tuple[str, Any]]:
    """(Key, value) of `gq show`, in order; None where the job has no value."""
    return [
        ("JobId", job["id"]), ("ArrayJobId", job.get("array_job_id")),
        ("ArrayTaskId", job.get("array_index")), ("JobName", job["name"]), ("UserId", job["user"]),
        ("QOS", job["qos"]), ("Priority", job["priority"]), ("JobState", job["state"]),
        ("Reason", job["reason"] or "None"), ("ExitCode", job["exit_code"]),
        ("RestartCnt", job.get("restart_count", 0)),
        ("Retries", f"{job.get('node_fail_count', 0)}/{job['retries']}"
         if job.get("retries") is not None else None), ("RunTime", elapsed(job)),
        ("Hold", job.get("hold")), ("BeginTime", job.get("begin_time")),
        ("Dependency", job.get("dependency")), ("Account", job.get("account")),
        ("TimeLimit", format_duration(job["time_limit_s"])), ("Signal", job.get("signal")),
        ("Share", "yes" if job.get("share") else None),
        ("CacheKey", job.get("cache_key")),
        ("ColdWait", format_duration(job["cold_wait_s"]) if job.get("cold_wait_s") else None),
        ("SubmitTime", job["submit_time"]), ("StartTime", job["start_time"]),
        ("EndTime", job["end_time"]), ("LastCheckpoint", job.get("last_checkpoint")),
        ("NumNodes", job["nodes"]),
        ("GpusPerNode", job["gpus_per_node"]), ("GpuType", job["gpu_type"]),
        ("GpuMem", format_size(job.get("gpu_mem"))), ("Cpus", job.get("cpus")),
        ("Mem", format_size(job.get("mem"))),
        ("MaxRSS", format_size(job["max_rss"]) if job.get("max_rss") is not None else None),
        ("TotalCPU", cpu_time(job.get("total_cpu_s"))),
        ("NodeList", ",".join(job["node_list"]) or None),
        ("GpuIds", ";".join(f"{n}:{','.join(map(str, g))}" for n, g in job["gpu_ids"].items())
         or None),
        ("WorkDir", job.get("work_dir")), ("StdOut", job.get("stdout")),
        ("StdErr", job.get("stderr")),
        ("ExpectedStart", job.get("expected_start")),
        ("ExpectedNodes", ",".join(job.get("expected_nodes") or []) or None),
        ("PriorityFactors", " ".join(f"{k}:{v}" for k, v in job["priority_factors"].items())
         if job.get("priority_factors") else None),
        # Its steps, STEPID:STATE[:EXIT]: `gq history -j` has their times and nodes.
        ("Steps", ",".join(f"{s['id']}:{s['state']}" + (
            "" if s.get("exit_code") is None else f":{s['exit_code']}")
            for s in job.get("steps") or []) or None),
    ]


def _used(gpu: dict[str, Any]) -> str:
    """A GPU's VRAM in use: "-" when its node reports none, "0" for none in use."""
    if "mem_used" not in gpu:
        return "-"
    return format_size(gpu["mem_used"]) if gpu["mem_used"] else "0"


def node_rows(nodes: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    headers = ["NODE", "STATE", "GPU", "TYPE", "VRAM", "UTIL", "USED", "TEMP", "JOB", "REASON"]
    rows: list[list[Any]] = []
    for n in nodes:
        if not n["gpus"]:
            rows.append([n["name"], n["state"], "-", "-", "-", "-", "-", "-", "-", n["reason"]])
        for g in n["gpus"]:
            rows.append([n["name"], n["state"], g["index"], g["type"], format_size(g["memory"]),
                         f"{g['util']}%" if "util" in g else "-",
                         _used(g),
                         f"{g['temp']}C" if "temp" in g else "-",
                         g.get("job") or "-",
                         # Why new jobs skip the GPU (its telemetry), or that it is stale.
                         "; ".join(filter(None, (n["reason"], g.get("skip"))))])
    return headers, rows
