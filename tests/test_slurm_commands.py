"""gq's Slurm commands print Slurm's formats: each form is checked against what Slurm 22.05
(the peer in ../shared/peers/slurm, and the corpus peer with slurmdbd for sacct) printed for
the same jobs, its output kept here as captured. gqd's records of those jobs are made as
gqd makes them (Job.to_json), the client is a stand-in, times are UTC.

The live tests (test_live_slurm.py) run the same commands against real daemons."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gq.hostlist import compress, counted, expand
from gq.model import Job, JobSpec, JobState
from gq.slurm import common, sacct, scancel, scontrol, sinfo, squeue

#: The peer's clock when it printed the listings below (2026-12-01T22:34:06 UTC).
NOW = 1796164446.0
SUBMIT = NOW - 3.0
#: squeue, as the peer printed it for: an array of 4 pending tasks, two jobs waiting for all
#: four nodes, one 1-GPU job and one 2-node job running for 2 s.
SQUEUE = """\
             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)
           5_[0-3]       gpu      arr     root PD       0:00      1 (Priority)
                 4       gpu     pend     root PD       0:00      4 (Priority)
                 3       gpu      big     root PD       0:00      4 (Resources)
                 1       gpu  sleeper     root  R       0:02      1 n1
                 2       gpu      two     root  R       0:02      2 n[1-2]
"""
SQUEUE_HO = "5_[0-3] PENDING\n4 PENDING\n3 PENDING\n1 RUNNING\n2 RUNNING\n"
SQUEUE_LONG = """\
             JOBID PARTITION     NAME     USER    STATE       TIME TIME_LIMI  NODES NODELIST(REASON)
           5_[0-3]       gpu      arr     root  PENDING       0:00      5:00      1 (Priority)
                 4       gpu     pend     root  PENDING       0:00      5:00      4 (Priority)
                 3       gpu      big     root  PENDING       0:00      5:00      4 (Resources)
                 1       gpu  sleeper     root  RUNNING       0:02      5:00      1 n1
                 2       gpu      two     root  RUNNING       0:02      2 n[1-2]
""".replace("0:02      2 n[1-2]", "0:02      5:00      2 n[1-2]")
SQUEUE_CODES = """\
JOBID|NAME|USER|STATE|ST|TIME|TIME_LIMIT|NODES|CPUS|TRES_PER_NODE|PARTITION|NODELIST(REASON)|NODELIST|REASON
5_[0-3]|arr|root|PENDING|PD|0:00|5:00|1|1|gres:gpu:1|gpu|(Priority)||Priority
4|pend|root|PENDING|PD|0:00|5:00|4|4|gres:gpu:8|gpu|(Priority)||Priority
3|big|root|PENDING|PD|0:00|5:00|4|4|gres:gpu:8|gpu|(Resources)||Resources
1|sleeper|root|RUNNING|R|0:02|5:00|1|1|gres:gpu:1|gpu|n1|n1|None
2|two|root|RUNNING|R|0:02|5:00|2|2|gres:gpu:2|gpu|n[1-2]|n[1-2]|None
"""
SQUEUE_START = """\
             JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES           NODELIST(REASON)
                 3       gpu      big     root PD 2026-12-01T22:39:04      4 n[1-4]               (Resources)
                 4       gpu     pend     root PD 2026-12-01T22:44:00      4 n[1-4]               (Priority)
           5_[0-3]       gpu      arr     root PD 2026-12-01T22:49:00      1 n4                   (Priority)
"""
SQUEUE_SIZES = "JOBID|USE\n1    |roo\n"
#: scontrol show job of the running 1-GPU job.
SHOW_JOB = """\
JobId=1 JobName=sleeper
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:02 TimeLimit=00:05:00 TimeMin=N/A
   SubmitTime=2026-12-01T22:34:03 EligibleTime=2026-12-01T22:34:03
   AccrueTime=2026-12-01T22:34:03
   StartTime=2026-12-01T22:34:04 EndTime=2026-12-01T22:39:04 Deadline=N/A
   SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T22:34:04 Scheduler=Backfill
   Partition=gpu AllocNode:Sid=localhost:4804
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=n1
   BatchHost=n1
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,node=1,billing=1
   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
   Features=(null) DelayBoot=00:00:00
   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)
   Command=(null)
   WorkDir=/tmp/slurmcli-cap
   StdErr=/tmp/slurmcli-cap/slurm-1.out
   StdIn=/dev/null
   StdOut=/tmp/slurmcli-cap/slurm-1.out
   Power=
   TresPerNode=gres:gpu:1
   
"""
#: What the peer says and gq cannot (no accounting there, Slurm's own scheduler internals).
SHOW_JOB_PEER_ONLY = {"Priority", "QOS", "Scheduler", "AllocNode:Sid", "TRES"}
#: sacct of the corpus peer (slurmdbd) for a 2-node job: 2 GPUs, 16 CPUs, 32G on each node.
SACCT_P = """\
JobID|JobName|State|ExitCode|Elapsed|Start|End|Partition|Account|AllocTRES|NodeList|MaxRSS|TotalCPU
55|ddp-torch|COMPLETED|0:0|00:00:01|2026-12-01T22:20:17|2026-12-01T22:20:18|gpu|root|billing=32,cpu=32,gres/gpu=4,mem=64G,node=2|n[1-2]||
"""
SACCT_DEFAULT = """\
JobID           JobName  Partition    Account  AllocCPUS      State ExitCode 
------------ ---------- ---------- ---------- ---------- ---------- -------- 
252                wrap        gpu       root          1  COMPLETED      0:0 
"""
SACCT_WIDTH = """\
JobID                               JobName      State    Elapsed 
------------ ------------------------------ ---------- ---------- 
252                                    wrap  COMPLETED   00:00:00 
"""
SINFO = """\
PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST
gpu*         up   infinite      2    mix n[1-2]
gpu*         up   infinite      2   idle n[3-4]
bf           up   infinite      2    mix n[1-2]
"""
SINFO_SUMMARY = """\
PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST
gpu*         up   infinite          2/2/0/4 n[1-4]
bf           up   infinite          2/0/0/2 n[1-2]
"""
SINFO_FORMAT = """\
PARTITION AVAIL TIMELIMIT NODES STATE NODELIST GRES CPUS MEMORY AVAIL_FEATURES CPUS(A/I/O/T)
gpu* up infinite 2 mix n[1-2] gpu:8 32 64000 (null) 3/61/0/64
gpu* up infinite 2 idle n[3-4] gpu:8 32 64000 (null) 0/64/0/64
bf up infinite 2 mix n[1-2] gpu:8 32 64000 (null) 3/61/0/64
"""


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr(time, "time", lambda: NOW)
    yield
    monkeypatch.undo()
    time.tzset()


def _record(job_id: int, name: str, state: str, nodes: list[str] | int, gpus: int, *,
            reason: str = "", priority: int = 1, task: tuple[int, int] | None = None,
            start: float | None = None, expected: tuple[float, list[str]] | None = None,
            **spec: Any) -> dict[str, Any]:
    """A job's record as gqd sends it (Job.to_json), with what `squeue --start` adds."""
    alloc = {n: list(range(gpus)) for n in nodes} if isinstance(nodes, list) else {}
    count = len(nodes) if isinstance(nodes, list) else nodes
    job = Job(id=job_id, spec=JobSpec(script="#!/bin/sh\n", name=name, user="root", uid=0,
                                      gid=0, cwd="/tmp/slurmcli-cap", nodes=count, gpus=gpus,
                                      time_limit_s=300, qos=None, partition="gpu",
                                      output="slurm-%j.out", **spec),
              state=JobState(state), reason=reason, submit_time=SUBMIT, start_time=start,
              alloc=alloc, priority=priority,
              array_job_id=task[0] if task else None, array_index=task[1] if task else None)
    data = job.to_json()
    if expected:
        data.update(expected_start=Job(id=0, spec=job.spec, submit_time=expected[0]
                                       ).to_json()["submit_time"], expected_nodes=expected[1])
    return data


def _queue() -> list[dict[str, Any]]:
    """The peer's queue: the records in the order gqd lists them (by id)."""
    four = ["n1", "n2", "n3", "n4"]
    return [
        _record(1, "sleeper", "RUNNING", ["n1"], 1, start=NOW - 2),
        _record(2, "two", "RUNNING", ["n1", "n2"], 2, start=NOW - 2),
        _record(3, "big", "PENDING", 4, 8, reason="Resources", priority=1,
                expected=(1796164744.0, four)),
        _record(4, "pend", "PENDING", 4, 8, reason="Priority", priority=2,
                expected=(1796165040.0, four)),
        *(_record(5 + i, "arr", "PENDING", 1, 1, reason="Priority", priority=3,
                  task=(5, i), expected=(1796165340.0, ["n4"]), array="0-3")
          for i in range(4)),
    ]


class _Client:
    """The client as the commands use it, answering from records."""

    _user = "root"

    def __init__(self, jobs: list[dict[str, Any]], nodes: list[dict[str, Any]] | None = None,
                 partitions: list[dict[str, Any]] | None = None) -> None:
        self.jobs, self.node_list, self.parts = jobs, nodes or [], partitions or []
        self.cancelled: list[Any] = []
        self.filters: list[Any] = []

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def queue(self, user: str | None = None, states: list[str] | None = None, all: bool = False,
              start: bool = False, fields: Any = None) -> list[dict[str, Any]]:  # noqa: A002
        return [j for j in self.jobs if (not states or j["state"] in states)
                and (not user or j["user"] == user)]

    def history(self, since: float, until: float, user: str | None = None,
                states: list[str] | None = None, ids: list[int] | None = None,
                partition: str | None = None) -> list[dict[str, Any]]:
        return [j for j in self.jobs if not ids or j["id"] in ids or j["array_job_id"] in ids]

    def show(self, ref: Any) -> dict[str, Any]:
        from gq.errors import NotFoundError
        for j in self.jobs:
            if ref in (j["id"], j["job_id"]):
                return j
        raise NotFoundError(f"job {ref} does not exist")

    def request(self, kind: str) -> dict[str, Any]:
        return {"nodes": self.node_list, "partitions": self.parts}

    def partitions(self) -> list[dict[str, Any]]:
        return self.parts

    def cancel(self, ids: list[Any], signal: str | None = None, batch_only: bool = False,
               filter: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: A002
        self.cancelled.append(ids)
        self.filters.append(filter)
        return {"cancelled": [], "errors": {str(i): f"job {i} does not exist" for i in ids
                                            if i == 999}}

    def hold(self, ids: list[Any]) -> dict[str, Any]:
        return {"done": [], "errors": {str(i): f"job {i} does not exist" for i in ids}}


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: Any,
         argv: list[str], client: _Client) -> tuple[int, str, str]:
    monkeypatch.setattr(common, "client", lambda: client)
    code = command.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv,expected", [
    ([], SQUEUE), (["-h", "-o", "%i %T"], SQUEUE_HO), (["-l"], SQUEUE_LONG),
    (["-o", "%i|%j|%u|%T|%t|%M|%l|%D|%C|%b|%P|%R|%N|%r"], SQUEUE_CODES),
    (["--start"], SQUEUE_START), (["-o", "%5i|%.3u", "-j", "1"], SQUEUE_SIZES),
])
def test_squeue_prints_slurms_formats(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], argv: list[str],
                                      expected: str) -> None:
    code, out, _ = _run(monkeypatch, capsys, squeue, argv, _Client(_queue()))
    if "-l" in argv:
        out = out.split("\n", 1)[1]  # (after the clock line sacct prints first)
    assert (code, out) == (0, expected)


def test_squeue_filters_and_its_errors(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    client = _Client(_queue())
    assert _run(monkeypatch, capsys, squeue, ["-h", "-o", "%i", "-t", "R"], client)[1] == \
        "1\n2\n"
    assert _run(monkeypatch, capsys, squeue, ["-h", "-o", "%i", "-j", "5_2"], client)[1] == \
        "5_2\n"
    assert _run(monkeypatch, capsys, squeue, ["-h", "-o", "%i", "-r", "-j", "5"], client)[1] \
        == "5_0\n5_1\n5_2\n5_3\n"
    assert _run(monkeypatch, capsys, squeue, ["-h", "-o", "%i", "-n", "two,big"], client)[1] \
        == "3\n2\n"
    assert _run(monkeypatch, capsys, squeue, ["-h", "-o", "%i", "-w", "n2"], client)[1] == "2\n"
    # As Slurm: no job of those ids is an error; no job of that user an empty listing.
    assert _run(monkeypatch, capsys, squeue, ["-j", "999"], client)[::2] == \
        (1, "slurm_load_jobs error: Invalid job id specified\n")
    assert _run(monkeypatch, capsys, squeue, ["-u", "nobody"], client)[:2] == \
        (0, SQUEUE.splitlines(keepends=True)[0])
    assert _run(monkeypatch, capsys, squeue, ["-o", "%-10j"], client)[::2] == \
        (1, "squeue: error: Invalid job format specification: -\n")


def test_scontrol_show_job_has_slurms_layout(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(monkeypatch, capsys, scontrol, ["show", "job", "1"], _Client(_queue()))
    assert code == 0

    def pairs(text: str) -> list[list[tuple[str, str]]]:
        return [[tuple(w.split("=", 1)) for w in line.split()]  # type: ignore[misc]
                for line in text.splitlines()]
    ours, peers = pairs(out), pairs(SHOW_JOB)
    # The same keys, on the same lines, in the same order ...
    assert [[k for k, _ in line] for line in ours] == [[k for k, _ in line] for line in peers]
    # ... and the same values, but for what only Slurm can know.
    for mine, theirs in zip(ours, peers):
        for (key, value), (_, expected) in zip(mine, theirs):
            if key not in SHOW_JOB_PEER_ONLY and key != "LastSchedEval":
                assert value == expected, key
    assert out.endswith("\n   \n")  # each job ends with Slurm's blank line


def test_scontrol_hostnames_and_errors(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    client = _Client(_queue())
    assert _run(monkeypatch, capsys, scontrol, ["show", "hostnames", "n[1-3,5],x7"],
                client)[:2] == (0, "n1\nn2\nn3\nn5\nx7\n")
    assert _run(monkeypatch, capsys, scontrol, ["show", "hostlist", "n1,n2,n3,n5"],
                client)[:2] == (0, "n[1-3,5]\n")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    assert _run(monkeypatch, capsys, scontrol, ["show", "hostnames"], client)[1] == \
        "gpu01\ngpu02\n"
    assert _run(monkeypatch, capsys, scontrol, ["show", "job", "999"], client)[::2] == \
        (1, "slurm_load_jobs error: Invalid job id specified\n")
    # scontrol takes prefixes of its entities, as scripts write them (`show jobid $ID`).
    for word in ("jobid", "jobs", "j"):
        assert _run(monkeypatch, capsys, scontrol, ["show", word, "1"], client)[1] == \
            _run(monkeypatch, capsys, scontrol, ["show", "job", "1"], client)[1] != ""
    assert _run(monkeypatch, capsys, scontrol, ["show", "hostname", "n[1-2]"],
                client)[1] == "n1\nn2\n"
    assert _run(monkeypatch, capsys, scontrol, ["show", "host", "n1"], client)[::2] == \
        (1, "invalid entity: host for keyword: show\n")
    assert _run(monkeypatch, capsys, scontrol, ["hold", "999"], client)[::2] == \
        (1, "Invalid job id specified for job 999\n")
    assert _run(monkeypatch, capsys, scontrol, ["show", "node", "nX"], client)[::2] == \
        (1, "Node nX not found\n")


def _finished() -> list[dict[str, Any]]:
    start = 1796163617.0  # 2026-12-01T22:20:17
    ddp = _record(55, "ddp-torch", "COMPLETED", ["n1", "n2"], 2, start=start, cpus=16,
                  mem=32 << 30, account="root")
    ddp.update(end_time="2026-12-01T22:20:18Z", exit_code=0)
    wrap = _record(252, "wrap", "COMPLETED", ["n1"], 0, start=start, account="root")
    wrap.update(end_time=wrap["start_time"], exit_code=0)
    return [ddp, wrap]


@pytest.mark.parametrize("argv,expected", [
    (["-P", "--format=JobID,JobName,State,ExitCode,Elapsed,Start,End,Partition,Account,"
      "AllocTRES,NodeList,MaxRSS,TotalCPU", "-j", "55"], SACCT_P),
    (["-j", "252"], SACCT_DEFAULT),
    (["-X", "-j", "252", "--format=JobID,JobName%30,State,Elapsed"], SACCT_WIDTH),
    (["-n", "-X", "-P", "-o", "JobID,State", "-j", "252"], "252|COMPLETED\n"),
    (["-p", "-n", "-o", "JobID,State", "-j", "252"], "252|COMPLETED|\n"),
])
def test_sacct_prints_slurms_formats(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], argv: list[str],
                                     expected: str) -> None:
    assert _run(monkeypatch, capsys, sacct, argv, _Client(_finished()))[:2] == (0, expected)


def test_sacct_names_an_array_tasks_step_by_the_task(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm's sacct: the step of task 5_1 (job 6) is JobID `5_1.0`, JobIDRaw `6.0` (a real
    array script's `srun` in each task: gq printed `6.0` for both)."""
    task = _record(6, "arr", "COMPLETED", ["n1"], 1, task=(5, 1), start=NOW - 9)
    task.update(end_time=task["start_time"], exit_code=0, steps=[{
        "id": "6.0", "name": "python", "state": "COMPLETED", "exit_code": 0,
        "start_time": task["start_time"], "end_time": task["start_time"], "nodes": ["n1"]}])
    out = _run(monkeypatch, capsys, sacct, ["-P", "-n", "-o", "JobID,JobIDRaw,State", "-j",
                                            "5"], _Client([task]))[1]
    assert out == "5_1|6|COMPLETED\n5_1.0|6.0|COMPLETED\n"


def test_sacct_parsable_lines_never_break_on_a_name(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    odd = _finished()[1]
    odd["name"] = "a|b\nc"
    out = _run(monkeypatch, capsys, sacct, ["-P", "-n", "-o", "JobID,JobName,State", "-j",
                                            "252"], _Client([odd]))[1]
    assert out == "252|a/b c|COMPLETED\n"


def _node(name: str, held: int) -> dict[str, Any]:
    return {"name": name, "state": "UP", "reason": "", "addr": "127.0.0.1", "cpus": 32,
            "mem": 64000 << 20, "features": [], "last_seen": None,
            "gpus": [{"index": i, "type": "gpu", "memory": 1, "job": 1 if i < held else None}
                     for i in range(8)]}


@pytest.mark.parametrize("argv,expected", [
    ([], SINFO), (["-s"], SINFO_SUMMARY),
    (["-o", "%P %a %l %D %t %N %G %c %m %f %C"], SINFO_FORMAT.replace("gpu:8", "gpu:gpu:8")),
])
def test_sinfo_prints_slurms_formats(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], argv: list[str],
                                     expected: str) -> None:
    nodes = [_node("n1", 3), _node("n2", 2), _node("n3", 0), _node("n4", 0)]
    parts = [{"name": "gpu", "nodes": ["n1", "n2", "n3", "n4"], "default": True,
              "default_qos": "", "default_time_s": 0, "max_time_s": 0},
             {"name": "bf", "nodes": ["n1", "n2"], "default": False, "default_qos": "",
              "default_time_s": 0, "max_time_s": 0}]
    jobs = [_record(1, "a", "RUNNING", ["n1"], 1, start=NOW, cpus=1),
            _record(2, "b", "RUNNING", ["n1", "n2"], 2, start=NOW, cpus=1)]
    assert _run(monkeypatch, capsys, sinfo, argv, _Client(jobs, nodes, parts))[:2] == \
        (0, expected)


def test_scancel_is_silent_about_jobs_that_are_not_there(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    client = _Client([])
    assert _run(monkeypatch, capsys, scancel, ["999"], client) == (0, "", "")
    assert _run(monkeypatch, capsys, scancel, ["-v", "999"], client)[::2] == (
        0, "scancel: error: Kill job error on job id 999: Invalid job id specified\n")
    assert _run(monkeypatch, capsys, scancel, ["abc"], client) == (
        1, "", "scancel: error: Invalid job id abc\n")
    assert _run(monkeypatch, capsys, scancel, ["-u", "nosuchuser"], client)[::2] == (
        1, "scancel: error: Invalid user name: nosuchuser\n")
    _run(monkeypatch, capsys, scancel, ["-t", "PD", "-n", "arr", "-p", "gpu"], client)
    assert client.filters[-1] == {"name": "arr", "partition": "gpu", "states": ["PENDING"]}


def test_hostlists_expand_and_compress_as_slurms() -> None:
    assert expand("n[1-3,5],x7") == ["n1", "n2", "n3", "n5", "x7"]
    assert expand("gpu[01-03]") == ["gpu01", "gpu02", "gpu03"]
    assert expand("a[1-2]b[3-4]") == ["a1b3", "a1b4", "a2b3", "a2b4"]
    assert compress(["n1", "n2", "n3", "n5"]) == "n[1-3,5]"
    assert compress(["gpu01", "gpu02", "login"]) == "gpu[01-02],login"
    assert compress(["n3", "n1"]) == "n[1,3]"
    assert counted([16, 16]) == "16(x2)" and counted([4, 2]) == "4,2"
    for bad in ("n[1-", "n[3-1]", "n[a]", "n]"):
        with pytest.raises(Exception, match="bad hostlist"):
            expand(bad)


def test_shepherds_installing_the_slurm_commands_at_once_all_get_whole_ones(tmp_path) -> None:
    """Every job a node starts makes sure of its Slurm commands (gq.slurm.shims.ensure); jobs
    start together, so many shepherds write the same files at the same moment. Each must come
    out with the commands in place, none may fail (it once did, with ENOENT on the rename of a
    temporary name they shared: the job ended FAILED, 127) or find half a file."""
    import subprocess
    import sys
    from gq.slurm import shims
    directory = tmp_path / "slurm-bin"
    # Each writer removes the files and installs them again, many times, racing the others.
    code = ("import sys; from pathlib import Path; from gq.slurm import shims\n"
            "d = Path(sys.argv[1])\n"
            "for _ in range(60):\n"
            "    for c in shims.COMMANDS:\n"
            "        (d / c).unlink(missing_ok=True)\n"
            "    shims.ensure(d)\n")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(directory)],
                                stderr=subprocess.PIPE, text=True) for _ in range(6)]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert all(w.returncode == 0 for w in writers), errors
    for command in shims.COMMANDS:
        assert (directory / command).read_text() == shims._text(command)
    assert not list(directory.glob(".*.tmp")), "a writer left its temporary file"
