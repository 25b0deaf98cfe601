"""scontrol: `show job [ID]`, `show node [NAME]`, `show partition [NAME]`, `show hostnames
[LIST]`, `show hostlist LIST`, `hold`, `release`, `requeue` and `update JobId=ID KEY=VALUE
...` (TimeLimit, JobName, QOS), in Slurm's key=value layout and words."""

from __future__ import annotations

import os
import sys

from gq import protocol
from gq.errors import GqError
from gq.hostlist import compress, expand
from gq.slurm import common
from gq.slurm.common import Failure

TYPE_CHECKING = False  # typing is not imported for the Slurm commands' usual calls
if TYPE_CHECKING:
    from typing import Any

USAGE = ("scontrol [show job|node|partition|hostnames|hostlist [NAME]] | hold|release|requeue "
         "JOBID... | update JobId=JOBID TimeLimit=|JobName=|QOS=VALUE ...")


def _null(value: Any) -> str:
    return "(null)" if value in (None, "") else str(value)


def job_lines(job: dict[str, Any], now: float) -> list[str]:
    """One job as `scontrol show job` shows it."""
    ran = job.get("start_time") is not None
    nodes = job["node_list"]
    start = job.get("start_time") or job.get("expected_start")
    array = f" ArrayJobId={job['array_job_id']} ArrayTaskId={job['array_index']}" \
        if job.get("array_job_id") is not None else ""
    tasks_per_node = -(-common.tasks(job) // max(1, job["nodes"]))
    exclusive = "NO" if job.get("exclusive") else "OK"
    where = f"NodeList={compress(nodes)}" if nodes else \
        f"NodeList= SchedNodeList={compress(job.get('expected_nodes') or []) or '(null)'}"
    state = job["state"]
    return [
        f"JobId={job['id']}{array} JobName={job['name']}",
        f"   UserId={job['user']}({job.get('uid', '')}) GroupId={_group(job.get('gid'))}"
        " MCS_label=N/A",
        f"   Priority={job.get('priority') or 0} Nice={job.get('nice') or 0} "
        f"Account={_null(job.get('account'))} QOS={_null(job.get('qos'))}",
        f"   JobState={state} Reason={job['reason'] or 'None'} "
        f"Dependency={_null(job.get('dependency'))}",
        f"   Requeue={1 if job.get('requeue', True) else 0} "
        f"Restarts={job.get('restart_count') or 0} BatchFlag=1 Reboot=0 "
        f"ExitCode={_exit(job)}",
        f"   RunTime={common.clock(common.elapsed_s(job, now), pad_hours=True)} "
        f"TimeLimit={common.limit(job['time_limit_s'], pad_hours=True)} TimeMin=N/A",
        f"   SubmitTime={common.local(job['submit_time'])} "
        f"EligibleTime={common.local(job.get('begin_time') or job['submit_time'])}",
        f"   AccrueTime={common.local(job['submit_time'])}",
        f"   StartTime={common.local(start, 'Unknown')} EndTime={_end(job)} Deadline=N/A",
        f"   SuspendTime=None SecsPreSuspend=0 LastSchedEval={common.local(start, 'Unknown')} "
        "Scheduler=Main",
        f"   Partition={job.get('partition') or ''} AllocNode:Sid=N/A",
        f"   ReqNodeList={_null(job.get('nodelist'))} ExcNodeList={_null(job.get('exclude'))}",
        f"   {where}",
        *([f"   BatchHost={nodes[0]}"] if nodes else []),
        f"   NumNodes={job['nodes']} NumCPUs={common.cpus(job)} NumTasks={common.tasks(job)} "
        f"CPUs/Task={job.get('cpus_per_task') or 1} ReqB:S:C:T=0:0:*:*",
        f"   TRES={_tres(job)}",
        f"   Socks/Node=* NtasksPerN:B:S:C={tasks_per_node if job.get('ntasks') else 0}:0:*:* "
        "CoreSpec=*",
        f"   MinCPUsNode={common.cpus(job) // max(1, job['nodes'])} "
        f"MinMemoryNode={common.mem_text(job['mem_per_node']) if job.get('mem_per_node') else 0}"
        " MinTmpDiskNode=0",
        f"   Features={_null(job.get('constraint'))} DelayBoot=00:00:00",
        f"   OverSubscribe={exclusive} Contiguous=0 Licenses=(null) Network=(null)",
        "   Command=(null)",
        f"   WorkDir={job.get('work_dir') or ''}",
        *([f"   Comment={job['comment']} "] if job.get("comment") else []),
        f"   StdErr={job.get('stderr') or ''}",
        "   StdIn=/dev/null",
        f"   StdOut={job.get('stdout') or ''}",
        "   Power=",
        *([f"   TresPerNode={common.tres_per_node(job)}"] if job["gpus_per_node"] else []),
        "   ",
    ]


def _group(gid: int | None) -> str:
    import grp
    try:
        return f"{grp.getgrgid(gid).gr_name}({gid})" if gid is not None else "(null)"
    except KeyError:
        return f"{gid}({gid})"


def _exit(job: dict[str, Any]) -> str:
    code = job.get("exit_code")
    return "0:0" if code is None else (f"0:{code - 128}" if code > 128 else f"{code}:0")


def _end(job: dict[str, Any]) -> str:
    if job.get("end_time"):
        return common.local(job["end_time"])
    from gq.units import parse_iso_time
    began = parse_iso_time(job.get("start_time") or job.get("expected_start"))
    if began is None or not job["time_limit_s"]:
        return "Unknown"
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(began + job["time_limit_s"]))


def _tres(job: dict[str, Any]) -> str:
    """scontrol's TRES order: cpu, mem, node, billing, gres/gpu."""
    n = job["nodes"]
    parts = [f"cpu={common.cpus(job)}"]
    if job.get("mem_per_node"):
        parts.append(f"mem={common.mem_text(job['mem_per_node'] * n)}")
    parts += [f"node={n}", f"billing={common.cpus(job)}"]
    if job["gpus_per_node"]:
        parts.append(f"gres/gpu={job['gpus_per_node'] * n}")
    return ",".join(parts)


def node_lines(node: dict[str, Any], parts: list[str], used_cpus: int) -> list[str]:
    gpus = node["gpus"]
    held = sum(1 for g in gpus if g.get("job"))
    kinds: dict[str, int] = {}
    for g in gpus:
        kinds[g["type"]] = kinds.get(g["type"], 0) + 1
    gres = ",".join(f"gpu:{t}:{n}" for t, n in kinds.items()) or "(null)"
    mem_mb = node["mem"] // (1024 * 1024)
    features = ",".join(node.get("features") or []) or "(null)"
    cfg = [f"cpu={node['cpus']}", f"mem={mem_mb}M", f"billing={node['cpus']}"] \
        + ([f"gres/gpu={len(gpus)}"] if gpus else [])
    alloc = ([f"cpu={used_cpus}"] if used_cpus else []) + ([f"gres/gpu={held}"] if held else [])
    return [
        f"NodeName={node['name']} Arch=N/A CoresPerSocket=1 ",
        f"   CPUAlloc={used_cpus} CPUEfctv={node['cpus']} CPUTot={node['cpus']} CPULoad=N/A",
        f"   AvailableFeatures={features}",
        f"   ActiveFeatures={features}",
        f"   Gres={gres}",
        f"   NodeAddr={node.get('addr') or node['name']} NodeHostName={node['name']} "
        "Version=gq",
        f"   RealMemory={mem_mb} AllocMem=0 FreeMem=N/A Sockets={node['cpus']} Boards=1",
        f"   State={_long_state(node, used_cpus)} ThreadsPerCore=1 TmpDisk=0 Weight=1 "
        "Owner=N/A MCS_label=N/A",
        f"   Partitions={','.join(parts)} ",
        f"   LastBusyTime={common.local(node.get('last_seen'))}",
        f"   CfgTRES={','.join(cfg)}",
        f"   AllocTRES={','.join(alloc)}",
        *([f"   Reason={node['reason']}"] if node.get("reason") else []),
        "",
    ]


#: Slurm's suffixes of a powered-down, a powering-up and a powering-down node's state.
POWER_SUFFIX = {"POWERED_DOWN": "~", "POWERING_UP": "#", "POWERING_DOWN": "%"}


def _long_state(node: dict[str, Any], used_cpus: int) -> str:
    """scontrol's State=: IDLE, MIXED ... and for power saving IDLE+CLOUD+POWERED_DOWN."""
    if node["state"] in POWER_SUFFIX:
        return f"IDLE+CLOUD+{node['state']}"
    return node_state(node, used_cpus).upper()


def node_state(node: dict[str, Any], used_cpus: int) -> str:
    """A node's state in Slurm's long words: idle, mixed, allocated, draining, drained, down."""
    gpus = node["gpus"]
    held = sum(1 for g in gpus if g.get("job"))
    busy = held or used_cpus
    if node["state"] == "DOWN":
        return "down*"
    if node["state"] in POWER_SUFFIX:  # Slurm's power saving marks: idle~, idle#, idle%
        return "idle" + POWER_SUFFIX[node["state"]]
    if node["state"] == "DRAIN":
        return "draining" if busy else "drained"
    if not busy:
        return "idle"
    whole = (gpus and held == len(gpus)) or (node["cpus"] and used_cpus >= node["cpus"])
    return "allocated" if whole else "mixed"


def used_cpus(jobs: list[dict[str, Any]]) -> dict[str, int]:
    """CPUs held on each node by the running jobs."""
    out: dict[str, int] = {}
    for job in jobs:
        if job["state"] == "RUNNING":
            for name in job["node_list"]:
                out[name] = out.get(name, 0) + common.cpus(job) // max(1, job["nodes"])
    return out


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(f"usage: {USAGE}")
        return 0 if argv else 1
    verb, rest = argv[0].lower(), argv[1:]
    if verb == "show":
        return _show(rest)
    if verb in ("hold", "uhold", "release", "requeue"):
        return _act("hold" if verb == "uhold" else verb, rest)
    if verb == "update":
        return _update(rest)
    raise Failure(f"invalid keyword: {argv[0]}")


def _entity(word: str) -> str:
    """scontrol's name for what `show` shows, from any prefix it takes (`jobid`, `jobs`, `j`,
    `nodes`, `part`: scripts write them), as scontrol matches them; else the word."""
    for full, least, entity in (("jobs", 1, "job"), ("jobid", 1, "job"), ("nodes", 1, "node"),
                                ("partitions", 2, "partition"), ("hostnames", 5, "hostnames")):
        if len(word) >= least and full.startswith(word):
            return entity
    return word


def _show(args: list[str]) -> int:
    what = _entity(args[0].lower()) if args else ""
    name = args[1] if len(args) > 1 else None
    if what in ("hostnames", "hostname"):
        text = name or os.environ.get("SLURM_JOB_NODELIST") or ""
        if not text:
            raise Failure("scontrol: error: host list is empty")
        print("\n".join(expand(text)))
        return 0
    if what == "hostlist":
        if not name:
            raise Failure("scontrol: error: host list is empty")
        print(compress(expand(name)))
        return 0
    if what == "job":
        return _show_jobs(name)
    if what == "node":
        return _show_nodes(name)
    if what == "partition":
        return _show_partitions(name)
    raise Failure(f"invalid entity: {what or '(none)'} for keyword: show")


def _show_jobs(name: str | None) -> int:
    import time
    with common.client() as c:
        if name is None:
            jobs = c.queue(all=True, start=True)
        else:
            ref = common.job_ids([name], "scontrol")[0]
            try:
                found = c.show(ref)
            except GqError:
                raise Failure("slurm_load_jobs error: Invalid job id specified") from None
            jobs = [found]
            if isinstance(ref, int) and found.get("array_job_id") == ref:
                jobs = [j for j in c.queue(all=True, start=True)
                        if j.get("array_job_id") == ref] or jobs
    if not jobs:
        print("No jobs in the system")
    now = time.time()
    for job in jobs:
        print("\n".join(job_lines(job, now)))
    return 0


def _show_nodes(name: str | None) -> int:
    with common.client() as c:
        reply = c.request(protocol.NODES)
        jobs = c.queue(states=["RUNNING"])
    nodes = [n for n in reply["nodes"] if name is None or n["name"] in expand(name)]
    if name is not None and not nodes:
        raise Failure(f"Node {name} not found")
    cpus = used_cpus(jobs)
    member: dict[str, list[str]] = {}
    for part in reply.get("partitions") or ():
        for node in part["nodes"]:
            member.setdefault(node, []).append(part["name"])
    for node in nodes:
        print("\n".join(node_lines(node, member.get(node["name"], []), cpus.get(node["name"], 0))))
    return 0


def _show_partitions(name: str | None) -> int:
    with common.client() as c:
        parts = c.partitions()
    parts = [p for p in parts if name is None or p["name"] == name]
    if name is not None and not parts:
        raise Failure(f"Partition {name} not found")
    for p in parts:
        print("\n".join([
            f"PartitionName={p['name']}",
            f"   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL",
            f"   Default={'YES' if p['default'] else 'NO'} QoS={p['default_qos'] or 'N/A'}",
            f"   DefaultTime={common.limit(p['default_time_s'], True) if p['default_time_s'] else 'NONE'} "
            f"MaxTime={common.limit(p['max_time_s'], True)}",
            f"   Nodes={compress(p['nodes']) or '(null)'}",
            f"   State=UP TotalNodes={len(p['nodes'])}",
            ""]))
    return 0


def _act(verb: str, args: list[str]) -> int:
    if not args:
        raise Failure(f"scontrol: error: {verb}: no job id given")
    ids = common.job_ids(args, "scontrol")
    with common.client() as c:
        reply = getattr(c, verb)(ids)
    for job_id, why in reply["errors"].items():
        print(_words(job_id, why), file=sys.stderr)
    return 1 if reply["errors"] else 0


def _words(job_id: str, why: str) -> str:
    if "does not exist" in why:
        return f"Invalid job id specified for job {job_id}"
    if "not pending" in why and "held" not in why:
        return f"Job is no longer pending execution for job {job_id}"
    if "is pending: it has not run yet" in why:
        return f"Job is pending execution for job {job_id}"
    return f"{why} for job {job_id}"


def _update(args: list[str]) -> int:
    pairs = {}
    for word in args:
        key, eq, value = word.partition("=")
        if not eq:
            raise Failure(f"scontrol: error: Invalid input: {word}\nRequest aborted")
        pairs[key.lower()] = value
    if "jobid" not in pairs:
        raise Failure("scontrol: error: No job id given: update JobId=ID KEY=VALUE ...")
    ids = common.job_ids([pairs.pop("jobid")], "scontrol")
    change: dict[str, Any] = {}
    for key, value in pairs.items():
        if key == "timelimit":
            from gq.units import parse_duration
            change["time_limit_s"] = 0 if value.upper() in ("UNLIMITED", "INFINITE") \
                else parse_duration(value)
        elif key in ("jobname", "name"):
            change["name"] = value
        elif key == "qos":
            change["qos"] = value
        else:
            raise Failure(f"Update of this parameter is not supported: {key}={value}\n"
                          "Request aborted")
    with common.client() as c:
        reply = c.update(ids, **change)
    for job_id, why in reply["errors"].items():
        print(_words(job_id, why), file=sys.stderr)
    return 1 if reply["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    return common.main("scontrol", run, argv)
