"""sacct: jobs from gqd's store in Slurm's accounting formats: the default table, `-P`/`-p`
(`|` between fields), `-n`, `-o/--format=Field[%size],...`, `-j`, `-S/-E`, `-u`/`-a`, `-s`,
`-r`. Each job is one line, then one a job step (`JOBID.STEP`, unless `-X`; gq keeps no
`.batch` or `.extern` steps); fields gq has no value for (MaxRSS, TotalCPU ...) are empty.

`-P`: a value holding `|` or a newline would split its line: sacct prints such values as they
are, gq replaces `|` by `/` and a newline by a space (gq.1 SLURM COMMANDS), so that every line
parses."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gq.slurm import common, fmt
from gq.units import parse_time

DEFAULT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
def _ran(job: dict[str, Any]) -> bool:
    return job.get("start_time") is not None


def _exit_code(job: dict[str, Any]) -> str:
    code = job.get("exit_code")
    if code is None:
        return "0:0"
    if code > 128 and job["state"] in ("CANCELLED", "TIMEOUT", "FAILED", "PREEMPTED"):
        return f"0:{code - 128}"  # killed by that signal
    return f"{code}:0"


def _elapsed(job: dict[str, Any]) -> float:
    return common.elapsed_s(job, time.time())


#: Field -> (its default width, how its value is made from a job).
FIELDS: dict[str, tuple[int, Any]] = {name: (width, func) for name, width, func in [
    ("JobID", 12, lambda j: j.get("job_id") or str(j["id"])),
    ("JobIDRaw", 12, lambda j: str(j["id"])),
    ("JobName", 10, lambda j: j["name"]),
    ("Partition", 10, lambda j: j.get("partition") or ""),
    ("Account", 10, lambda j: j.get("account") or ""),
    ("AllocCPUS", 10, lambda j: str(common.cpus(j) if _ran(j) else 0)),
    ("NCPUS", 10, lambda j: str(common.cpus(j) if _ran(j) else 0)),
    ("ReqCPUS", 8, lambda j: str(common.cpus(j))),
    ("State", 10, lambda j: j["state"]),
    ("ExitCode", 8, _exit_code),
    ("DerivedExitCode", 10, _exit_code),
    ("Elapsed", 10, lambda j: common.clock(_elapsed(j), pad_hours=True)),
    ("ElapsedRaw", 10, lambda j: str(int(_elapsed(j)))),
    ("CPUTime", 10, lambda j: common.clock(_elapsed(j) * common.cpus(j), pad_hours=True)),
    ("CPUTimeRAW", 10, lambda j: str(int(_elapsed(j) * common.cpus(j)))),
    ("Start", 19, lambda j: common.local(j["start_time"], "Unknown")),
    ("End", 19, lambda j: common.local(j["end_time"], "Unknown")),
    ("Submit", 19, lambda j: common.local(j["submit_time"], "Unknown")),
    ("Eligible", 19, lambda j: common.local(j["submit_time"], "Unknown")),
    ("AllocTRES", 10, lambda j: common.tres(j) if _ran(j) else ""),
    ("ReqTRES", 10, common.tres),
    ("NodeList", 15, lambda j: _nodes(j)),
    ("NNodes", 8, lambda j: str(j["nodes"])),
    ("AllocNodes", 10, lambda j: str(j["nodes"] if _ran(j) else 0)),
    ("NTasks", 8, lambda j: ""),
    ("MaxRSS", 10, lambda j: ""), ("MaxVMSize", 10, lambda j: ""),
    ("AveRSS", 10, lambda j: ""), ("TotalCPU", 10, lambda j: ""),
    ("UserCPU", 10, lambda j: ""), ("SystemCPU", 10, lambda j: ""),
    ("User", 9, lambda j: j["user"]), ("UID", 6, lambda j: str(j.get("uid", ""))),
    ("QOS", 10, lambda j: j.get("qos") or ""),
    ("Timelimit", 10, lambda j: common.limit(j["time_limit_s"], pad_hours=True)),
    ("TimelimitRaw", 10, lambda j: str((j["time_limit_s"] or 0) // 60) if j["time_limit_s"]
     else "UNLIMITED"),
    ("Priority", 10, lambda j: str(j.get("priority") or 0)),
    ("Comment", 10, lambda j: j.get("comment") or ""),
    ("WorkDir", 10, lambda j: j.get("work_dir") or ""),
    ("Reason", 10, lambda j: j["reason"] or "None"),
    ("ReqMem", 10, lambda j: common.mem_text(j["mem_per_node"]) if j.get("mem_per_node")
     else "0"),
    ("Restarts", 8, lambda j: str(j.get("restart_count") or 0)),
    ("Constraints", 19, lambda j: j.get("constraint") or ""),
]}


def _nodes(job: dict[str, Any]) -> str:
    from gq.hostlist import compress
    return compress(job["node_list"]) if job["node_list"] else "None assigned"


COLUMNS: dict[str, fmt.Column] = {name: (name, func) for name, (_, func) in FIELDS.items()}


def parser() -> argparse.ArgumentParser:
    return common.parser(
        "sacct", ("-j --jobs", common.MANY), ("-S --starttime", common.ONE),
        ("-E --endtime", common.ONE), ("-u --user --uid", common.MANY),
        ("-a --allusers", common.FLAG), ("-s --state", common.MANY),
        ("-r --partition", common.ONE), ("-P --parsable2", common.FLAG),
        ("-p --parsable", common.FLAG), ("-n --noheader", common.FLAG),
        ("-X --allocations", common.FLAG), ("-o --format", common.ONE),
        ("-b --brief", common.FLAG), ("-D --duplicates", common.FLAG),
        ("-L --allclusters", common.FLAG))


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    now = time.time()
    refs = common.job_ids(args.jobs or [], "sacct")
    # Without -S: today's jobs, or (naming jobs) all of theirs, as sacct.
    since = parse_time(args.starttime, now) if args.starttime else \
        (0.0 if refs else parse_time("today", now))
    until = parse_time(args.endtime, now) if args.endtime else now
    users = common.split(args.user)
    with common.client() as c:
        user = None if args.allusers or len(users) > 1 else (users[0] if users else c._user)
        jobs = c.history(since, until, user=user, states=common.states(args.state, "sacct"),
                         ids=sorted({int(str(r).split("_")[0]) for r in refs}) or None,
                         partition=args.partition)
    if users:
        jobs = [j for j in jobs if j["user"] in users]
    if refs:
        jobs = [j for j in jobs if j["id"] in refs or j.get("array_job_id") in refs
                or j.get("job_id") in refs]
    form = args.format or ("JobID,State,ExitCode" if args.brief else DEFAULT)
    chosen = fmt.fields(form, COLUMNS, "sacct")
    from gq.cli.render import fold_pending_tasks
    rows = [row for j, shown in fold_pending_tasks(jobs)
            for row in [{**j, "job_id": shown}, *([] if args.allocations else _steps(j, shown))]]
    for line in lines(chosen, rows, args):
        print(line)
    return 0


def _steps(job: dict[str, Any], shown: str) -> list[dict[str, Any]]:
    """A job's steps as rows of their own: the job's fields, but those the step has. A step
    of an array's task is named by the task's id, as Slurm's sacct names it (`5_1.0`; its
    JobIDRaw is the task's own job id, `6.0`)."""
    return [{**job, "job_id": f"{shown}.{str(s['id']).rpartition('.')[2]}", "id": s["id"], "name": s["name"], "state": s["state"],
             "exit_code": s["exit_code"], "start_time": s["start_time"],
             "end_time": s["end_time"], "node_list": s["nodes"], "nodes": len(s["nodes"]),
             "partition": "", "qos": "", "time_limit_s": None, "reason": ""}
            for s in job.get("steps") or []]


def lines(chosen: list[tuple[str, int | None]], rows: list[dict[str, Any]],
          args: argparse.Namespace) -> list[str]:
    from gq.cli.render import one_line
    values = [[one_line(COLUMNS[name][1](row)) for name, _ in chosen] for row in rows]
    names = [name for name, _ in chosen]
    if args.parsable2 or args.parsable:
        end = "|" if args.parsable else ""
        out = [] if args.noheader else ["|".join(names) + end]
        return out + ["|".join(v) + end for v in values]
    widths = [size if size is not None else FIELDS[name][0] for name, size in chosen]

    def cell(text: str, width: int, left: bool) -> str:
        if len(text) > width:
            text = text[:width - 1] + "+"  # sacct marks a value cut short
        return text.ljust(width) if left else text.rjust(width)
    lefts = [name in ("JobID", "JobIDRaw") for name in names]
    out = [] if args.noheader else [
        " ".join(cell(n, w, left) for n, w, left in zip(names, widths, lefts)) + " ",
        " ".join("-" * w for w in widths) + " "]
    return out + [" ".join(cell(t, w, left) for t, w, left in zip(v, widths, lefts)) + " "
                  for v in values]


def main(argv: list[str] | None = None) -> int:
    return common.main("sacct", run, argv)

