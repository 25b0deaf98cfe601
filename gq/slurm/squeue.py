"""squeue: pending and running jobs in Slurm's formats (`-o`, `-l`, `--start`, `-h`), filtered
by `-u`, `-j`, `-t`, `-p`, `-n`, `-A`, `-q`, `-w`, `--me`; an array's pending tasks folded into
one line (`12_[3-9]`) unless `-r`."""

from __future__ import annotations

import argparse
import time

from gq.slurm import common, fmt
from gq.slurm.common import Failure

TYPE_CHECKING = False  # typing is not imported for the Slurm commands' usual calls
if TYPE_CHECKING:
    from typing import Any

DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
START = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"

if TYPE_CHECKING:
    #: A row: (job, the id shown, now).
    Row = tuple[dict[str, Any], str, float]


def _null(value: Any) -> str:
    return "(null)" if value in (None, "") else str(value)


def _where(row: Row) -> str:
    job = row[0]
    if job["state"] == "PENDING":
        return f"({job['reason'] or 'None'})"
    return _nodes(row)


def _nodes(row: Row) -> str:
    from gq.hostlist import compress
    return compress(row[0]["node_list"])


def _compress(names: list[str] | None) -> str:
    from gq.hostlist import compress
    return compress(names or [])


def _start(row: Row) -> str:
    job = row[0]
    return common.local(job.get("start_time") or job.get("expected_start"))


def _end(row: Row) -> str:
    job = row[0]
    if job.get("end_time"):
        return common.local(job["end_time"])
    start = common.local(job.get("start_time") or job.get("expected_start"), "")
    if not start or not job["time_limit_s"]:
        return "N/A"
    from gq.units import parse_iso_time
    began = parse_iso_time(job.get("start_time") or job.get("expected_start")) or 0.0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(began + job["time_limit_s"]))


def _left(row: Row) -> str:
    job, _, now = row
    if not job["time_limit_s"]:
        return "UNLIMITED"
    return common.clock(job["time_limit_s"] - common.elapsed_s(job, now))


def _task(row: Row) -> str:
    job, shown, _ = row
    if job.get("array_job_id") is None:
        return "N/A"
    return shown.split("_", 1)[1].strip("[]") if "_" in shown else str(job["array_index"])


COLUMNS: dict[str, fmt.Column] = {
    "i": ("JOBID", lambda r: r[1]), "A": ("JOBID", lambda r: str(r[0]["id"])),
    "F": ("ARRAY_JOB_ID", lambda r: str(r[0].get("array_job_id") or r[0]["id"])),
    "K": ("ARRAY_TASK_ID", _task), "j": ("NAME", lambda r: r[0]["name"]),
    "u": ("USER", lambda r: r[0]["user"]), "T": ("STATE", lambda r: r[0]["state"]),
    "t": ("ST", lambda r: common.SHORT.get(r[0]["state"], r[0]["state"])),
    "M": ("TIME", lambda r: common.clock(common.elapsed_s(r[0], r[2]))),
    "l": ("TIME_LIMIT", lambda r: common.limit(r[0]["time_limit_s"])),
    "L": ("TIME_LEFT", _left), "D": ("NODES", lambda r: str(r[0]["nodes"])),
    "C": ("CPUS", lambda r: str(common.cpus(r[0]))),
    "b": ("TRES_PER_NODE", lambda r: common.tres_per_node(r[0])),
    "P": ("PARTITION", lambda r: r[0].get("partition") or ""),
    "R": ("NODELIST(REASON)", _where), "N": ("NODELIST", _nodes),
    "r": ("REASON", lambda r: r[0]["reason"] or "None"), "q": ("QOS", lambda r: _null(r[0]["qos"])),
    "a": ("ACCOUNT", lambda r: _null(r[0].get("account"))), "S": ("START_TIME", _start),
    "e": ("END_TIME", _end), "V": ("SUBMIT_TIME", lambda r: common.local(r[0]["submit_time"])),
    "Z": ("WORK_DIR", lambda r: r[0].get("work_dir") or ""), "o": ("COMMAND", lambda r: "(null)"),
    "p": ("PRIORITY", lambda r: f"{(r[0].get('priority') or 0) / 2**32:.14f}"),
    "Q": ("PRIORITY", lambda r: str(r[0].get("priority") or 0)),
    "y": ("NICE", lambda r: str(r[0].get("nice") or 0)),
    "m": ("MIN_MEMORY", lambda r: common.mem_text(r[0]["mem_per_node"])
          if r[0].get("mem_per_node") else "0"),
    "k": ("COMMENT", lambda r: _null(r[0].get("comment"))),
    "f": ("FEATURES", lambda r: _null(r[0].get("constraint"))),
    "E": ("DEPENDENCY", lambda r: _null(r[0].get("dependency"))),
    "Y": ("SCHEDNODES", lambda r: _compress(r[0].get("expected_nodes")) or "(null)"),
    "U": ("UID", lambda r: str(r[0].get("uid", ""))),
    "c": ("MIN_CPUS", lambda r: str(common.cpus(r[0]) // max(1, r[0]["nodes"]))),
    "h": ("OVER_SUBSCRIBE", lambda r: "NO" if r[0].get("exclusive") else "OK"),
    "B": ("EXEC_HOST", lambda r: r[0]["node_list"][0] if r[0]["node_list"] else "n/a"),
}


def parser() -> argparse.ArgumentParser:
    p = common.parser(
        "squeue", ("-h --noheader", common.FLAG), ("-o --format", common.ONE),
        ("-l --long", common.FLAG), ("--start", common.FLAG), ("-r --array", common.FLAG),
        ("-u --user", common.MANY), ("--me", common.FLAG), ("-t --states", common.MANY),
        ("-p --partition", common.MANY), ("-n --name", common.MANY),
        ("-A --account", common.MANY), ("-q --qos", common.MANY),
        ("-w --nodelist", common.MANY), ("-v --verbose", common.FLAG),
        ("-a --all", common.FLAG))  # -a: every partition, which gq lists anyway
    p.add_argument("-j", "--jobs", action="append", nargs="?", const="")
    return p


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    wanted = common.states(args.states, "squeue") or (["PENDING"] if args.start else None)
    refs = common.job_ids(args.jobs or [], "squeue")
    with common.client() as c:
        users = common.split(args.user) + ([c._user] if args.me else [])
        ended = wanted is not None and bool(set(wanted) - set(common.LIVE))
        jobs = c.queue(states=wanted or list(common.LIVE), all=ended or bool(refs), start=True,
                       user=users[0] if len(users) == 1 else None)
    now = time.time()
    jobs = [j for j in jobs if _matches(j, args, users, refs)]
    if refs and not jobs:
        raise Failure("slurm_load_jobs error: Invalid job id specified")
    # Pending first, by priority (--start: by expected start), then running, by id.
    jobs.sort(key=lambda j: (j["state"] != "PENDING", (j.get("expected_start") or "~")
                             if args.start else -(j.get("priority") or 0)
                             if j["state"] == "PENDING" else 0, j["id"]))
    form = args.format or (START if args.start else LONG_FORMAT if args.long else DEFAULT)
    if args.long and not args.noheader:
        print(time.strftime("%a %b %d %H:%M:%S %Y"))
    print_format(form, jobs, header=not args.noheader, fold=not args.array, now=now)
    return 0


def print_format(form: str, jobs: list[dict[str, Any]], header: bool, fold: bool = True,
                 now: float | None = None, prog: str = "squeue") -> None:
    """`jobs` in a squeue format (also `gq queue -o`): an array's pending tasks folded into one
    line unless not `fold`."""
    from gq.cli.render import fold_pending_tasks
    shown = fold_pending_tasks(jobs) if fold else \
        [(j, j.get("job_id") or str(j["id"])) for j in jobs]
    moment = time.time() if now is None else now
    for text in fmt.render(fmt.parse(form, COLUMNS, prog), COLUMNS,
                           [(j, str(i), moment) for j, i in shown], header=header):
        print(text)


def _matches(job: dict[str, Any], args: argparse.Namespace, users: list[str],
             refs: list[int | str]) -> bool:
    if users and job["user"] not in users:
        return False
    if refs and not (job["id"] in refs or job.get("array_job_id") in refs
                     or job.get("job_id") in refs):
        return False
    for values, key in ((args.partition, "partition"), (args.name, "name"),
                        (args.account, "account"), (args.qos, "qos")):
        wanted = common.split(values)
        if wanted and not set(str(job.get(key) or "").split(",")) & set(wanted):
            return False
    nodes = common.split(args.nodelist)
    if nodes:
        from gq.hostlist import expand
        if not set(job["node_list"]) & {n for text in nodes for n in expand(text)}:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    return common.main("squeue", run, argv)
