"""`gq history` (like sacct) and `gq report` (GPU-hours, and the wasted ones), from gqd's store."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any, Optional

import typer

from gq.cli import query, render
from gq.model import iso_time, parse_time

#: How a run that ended this way wasted its GPU time (`gq report`); other outcomes are use.
#: Running out of memory is the job's own failure.
WASTE_CAUSES = {"PREEMPTED": "preempted", "FAILED": "failed", "TIMEOUT": "timeout",
                "NODE_FAIL": "node_fail", "OUT_OF_MEMORY": "failed"}
REPORT_COLUMNS = ("GROUP", "NAME", "GPU_HOURS", "WASTED_GPU_HOURS")
HISTORY_COLUMNS = ("JobID", "JobName", "User", "Account", "QOS", "State", "ExitCode", "Submit",
                   "Start", "End", "Elapsed", "GPUs", "NodeList", "Restarts", "MaxRSS",
                   "TotalCPU")


def gpu_hours(hours: float) -> str:
    """GPU-hours to two significant figures (0.0034, 0.52, 12, 1300): small waste shows as
    itself, not as 0.00, and large use without false precision."""
    if hours == 0 or not math.isfinite(hours):
        return f"{hours:g}"
    digits = 1 - math.floor(math.log10(abs(hours)))  # decimals that keep two figures
    rounded = round(hours, digits)
    if abs(rounded) >= 10 ** (2 - digits):  # 9.96 -> 10.0: one decimal too many now
        digits -= 1
        rounded = round(hours, digits)
    return f"{rounded:.{max(digits, 0)}f}"


def register(app: typer.Typer) -> None:
    app.command("history")(history)
    app.command("report")(report)


def history(
    since: Optional[str] = typer.Option(None, "-S", "--since", metavar="TIME",
                                        help="jobs not ended before TIME (default: today 00:00)"),
    until: Optional[str] = typer.Option(None, "-E", "--until", metavar="TIME",
                                        help="jobs submitted by TIME (default: now)"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="this user's jobs (default: mine)"),
    all_users: bool = typer.Option(False, "-a", "--allusers", help="every user's jobs"),
    state: Optional[str] = typer.Option(None, "-s", "--state", help="only these states (comma list)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
    parsable: bool = typer.Option(False, "-p", "--parsable", help="'|' between fields, a header line first"),
    job_ids: Optional[str] = typer.Option(None, "-j", "--jobs", help="only these jobs (comma list; default window: since ever)"),
) -> int:
    """Jobs from the head's store, ended or not (like sacct)."""
    now = time.time()
    refs = query.job_refs(job_ids)
    start = parse_time(since, now) if since else 0.0 if refs else parse_time("today", now)
    end = parse_time(until, now) if until else now
    with query.client() as client:
        who = None if all_users else (user or client._user)
        jobs = client.history(start, end, user=who, states=query.states(state),
                              ids=sorted({int(str(r).split("_")[0]) for r in refs}) or None)
    if refs:
        jobs = [j for j in jobs if j["id"] in refs or j.get("array_job_id") in refs
                or j.get("job_id") in refs]
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "since": iso_time(start),
                          "until": iso_time(end), "jobs": jobs})
        return 0
    render.listing(HISTORY_COLUMNS, [row for j in jobs for row in _history_rows(j)], parsable)
    return 0


def _history_rows(j: dict[str, Any]) -> list[list[Any]]:
    """A job's line, then one per step (JOBID.STEP), as sacct lists them."""
    return [_history_row(j), *([s["id"], s["name"], j["user"], j.get("account") or "", j["qos"],
                                s["state"], "" if s["exit_code"] is None else s["exit_code"],
                                j["submit_time"], s["start_time"] or "", s["end_time"] or "",
                                render.elapsed(s), "", ",".join(s["nodes"]), "", "", ""]
                               for s in j.get("steps") or [])]


def _history_row(j: dict[str, Any]) -> list[Any]:
    return [j.get("job_id") or j["id"], j["name"], j["user"], j.get("account") or "", j["qos"],
            j["state"], "" if j["exit_code"] is None else j["exit_code"], j["submit_time"],
            j["start_time"] or "", j["end_time"] or "", render.elapsed(j),
            j["gpus_per_node"] * j["nodes"], ",".join(j["node_list"]), j.get("restart_count", 0),
            render.format_size(j["max_rss"]) if j.get("max_rss") is not None else "",
            render.cpu_time(j.get("total_cpu_s")) or ""]


def report(
    since: Optional[str] = typer.Option(None, "-S", "--since", metavar="TIME",
                                        help="start of the period (default: now-7d)"),
    until: Optional[str] = typer.Option(None, "-E", "--until", metavar="TIME",
                                        help="end of the period (default: now)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
    parsable: bool = typer.Option(False, "-p", "--parsable",
                                  help="GROUP|NAME|GPU_HOURS|WASTED_GPU_HOURS lines, a header "
                                       "first"),
) -> int:
    """GPU-hours by user, account and QOS over a period, with the wasted GPU-hours apart."""
    now = time.time()
    start = parse_time(since or "now-7d", now)
    end = parse_time(until, now) if until else now
    with query.client() as client:
        rows = client.accounting(start, end)
    data = {"schema_version": render.JSON_SCHEMA_VERSION, "since": iso_time(start),
            "until": iso_time(end), **summarize(rows)}
    if as_json:
        render.emit_json(data)
        return 0
    if parsable:
        render.parsable(REPORT_COLUMNS, _report_rows(data))
        return 0
    print(f"GPU-hours from {data['since']} to {data['until']}: {gpu_hours(data['gpu_hours'])}, "
          f"of which wasted {gpu_hours(data['wasted_gpu_hours'])} ("
          + ", ".join(f"{k} {gpu_hours(v)}" for k, v in data["wasted_by_cause"].items()) + ")")
    for key in ("user", "account", "qos"):
        print()
        render.table([key.upper(), "GPU_HOURS", "WASTED_GPU_HOURS"],
                     [[r[key] or "-", gpu_hours(r["gpu_hours"]), gpu_hours(r["wasted_gpu_hours"])]
                      for r in data[f"by_{key}"]])
    return 0


def _report_rows(data: dict[str, Any]) -> list[list[Any]]:
    """`report --parsable`: the totals, each user, account and QOS, and each waste cause."""
    rows = [["total", "", f"{data['gpu_hours']:.4f}", f"{data['wasted_gpu_hours']:.4f}"]]
    for key in ("user", "account", "qos"):
        rows += [[key, r[key] or "", f"{r['gpu_hours']:.4f}", f"{r['wasted_gpu_hours']:.4f}"]
                 for r in data[f"by_{key}"]]
    rows += [["wasted", cause, f"{h:.4f}", f"{h:.4f}"]
             for cause, h in data["wasted_by_cause"].items()]
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals and per user / account / QOS GPU-hours from the head's accounting rows."""
    hours: dict[str, dict[str, list[float]]] = {k: defaultdict(lambda: [0.0, 0.0])
                                                for k in ("user", "account", "qos")}
    causes = dict.fromkeys(WASTE_CAUSES.values(), 0.0)
    total = wasted = 0.0
    for row in rows:
        h = row["gpu_seconds"] / 3600
        cause = WASTE_CAUSES.get(row["state"])
        # A run stopped from outside lost only the work since its last checkpoint (gqd's
        # saved_gpu_seconds: the time before it, which the next run resumes from, is use).
        lost = max(h - row.get("saved_gpu_seconds", 0.0) / 3600, 0.0) if cause else 0.0
        total += h
        if cause:
            wasted += lost
            causes[cause] += lost
        for key, table in hours.items():
            table[row[key]][0] += h
            table[row[key]][1] += lost
    return {"gpu_hours": total, "wasted_gpu_hours": wasted, "wasted_by_cause": causes,
            **{f"by_{key}": [{key: name, "gpu_hours": used, "wasted_gpu_hours": lost}
                             for name, (used, lost) in sorted(table.items())]
               for key, table in hours.items()}}
