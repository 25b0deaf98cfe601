"""`gq update` (scontrol update), `gq queue --start` (squeue --start) and `gq cancel --signal`
(scancel --signal) through the real CLI against live daemons. The test process is an admin of
its personal cluster; what an owner who is not an admin may do is in tests/test_users.py."""

from __future__ import annotations

import calendar
import json
import os
import signal
import time
from pathlib import Path

from tests.conftest import LiveCluster, prepare, running, wait_for

#: The default QOS and one capped at an hour.
QOS = """
[qos.normal]
priority = 10
[qos.pro]
priority = 100
preempts = ["free"]
[qos.free]
priority = 1
[qos.short]
priority = 5
max_time = "1h"
"""


def _json(live: LiveCluster, *args: str) -> dict:
    return json.loads(live.gq(*args, "--json", check=True).stdout)


def test_update_time_qos_and_name_persist_per_array_task_and_bind_the_next_pass(
        tmp_path: Path) -> None:
    with running(prepare(tmp_path), nodes=1, fake_gpus="8") as live:
        live.reconfigure(QOS)
        # An array's tasks share one spec in gqd's memory: changing one task changes only it.
        array = live.submit("--array", "0-2", "--hold", "-t", "2h", "-J", "arr", "--wrap", "true")
        assert live.gq("update", f"{array}_1", "--time", "30m", "--name", "one").returncode == 0
        tasks = {i: live.show(f"{array}_{i}") for i in range(3)}
        assert [(t["time_limit_s"], t["name"]) for t in tasks.values()] == [
            (7200, "arr"), (1800, "one"), (7200, "arr")]
        # A QOS's max_time binds admins too, and the refusal names it.
        over = live.gq("update", f"{array}_0", "--qos", "short")
        assert over.returncode == 1 and "01:00:00" in over.stderr and "short" in over.stderr
        assert live.show(f"{array}_0")["qos"] == "normal"
        assert live.gq("update", f"{array}_0", "-t", "45m", "-q", "short").returncode == 0
        assert live.gq("update", f"{array}_2", "--time", "3h").returncode == 0  # an admin raises
        assert live.gq("update", str(array)).returncode == 2  # nothing to change
        assert live.gq("update", "999999", "--name", "x").returncode == 1

        # Persisted: a gqd killed and restarted reads the changes back from its store.
        head = live.head_pid()
        os.kill(head, signal.SIGKILL)
        wait_for(lambda: live.head_pid() is None, "gqd to die")
        assert live.gq("up").returncode == 0
        after = {i: live.show(f"{array}_{i}") for i in range(3)}
        assert [(t["time_limit_s"], t["name"], t["qos"]) for t in after.values()] == [
            (2700, "arr", "short"), (1800, "one", "normal"), (10800, "arr", "normal")]
        wait_for(lambda: all(n["state"] == "UP" for n in live.nodes()), "the node to re-register")
        live.gq("cancel", str(array), check=True)

        # A running job: only its name may change.
        blocker = live.submit("-g", "4", "-t", "10m", "-J", "blocker", "--wrap", "sleep 600")
        live.wait_state(blocker, "RUNNING")
        refused = live.gq("update", str(blocker), "--time", "5m")
        assert refused.returncode == 1 and "RUNNING" in refused.stderr, refused.stderr
        assert live.gq("update", str(blocker), "--name", "renamed").returncode == 0
        assert live.show(blocker)["name"] == "renamed"

        # The next pass sees an update: the whole node is reserved for `big` when the blocker's
        # limit is up, so a 1-hour `small` cannot backfill; cut to 5 minutes it fits before.
        big = live.submit("-g", "8", "-t", "1h", "--wrap", "sleep 600")
        small = live.submit("-g", "4", "-t", "1h", "-q", "free", "--wrap", "sleep 600")
        wait_for(lambda: live.show(big).get("expected_start")
                 and live.show(small)["reason"] not in ("", "None"),
                 "a pass to reserve the node for the big job and give the small one a reason")

        # gq queue --start: the reservation's start time and node, in every output form.
        start = _epoch(live.show(big)["expected_start"])
        assert abs(start - (_epoch(live.show(blocker)["start_time"]) + 600)) <= 2
        table = live.gq("queue", "--start", check=True).stdout.splitlines()
        assert table[0].split() == ["JOBID", "NAME", "USER", "ST", "START_TIME", "NODES",
                                    "REASON"]
        row = next(ln.split() for ln in table[1:] if ln.split()[0] == str(big))
        assert row[3:6] == ["PD", live.show(big)["expected_start"], "node1"], table
        assert all(ln.split()[0] != str(blocker) for ln in table[1:]), "pending jobs only"
        lines = live.gq("queue", "--start", "-p", check=True).stdout.splitlines()
        assert lines[0] == "JOBID|NAME|USER|ST|START_TIME|NODES|REASON"
        assert f"{big}|wrap|" in lines[1], lines  # soonest first
        jobs = {j["id"]: j for j in _json(live, "queue", "--start")["jobs"]}
        assert jobs[big]["expected_nodes"] == ["node1"] and set(jobs) == {big, small}
        assert live.gq("queue", "--start", "--state", "R").returncode == 2

        assert live.show(small)["state"] == "PENDING"
        assert live.gq("update", str(small), "--time", "5m").returncode == 0
        live.wait_state(small, "RUNNING")
        assert live.show(big)["state"] == "PENDING"
        nothing = live.gq("queue", "--start", "-p", check=True).stdout.splitlines()
        assert [ln.split("|")[0] for ln in nothing[1:]] == [str(big)]


def test_cancel_signal_reaches_a_running_job_without_ending_it(tmp_path: Path) -> None:
    live = prepare(tmp_path)
    live.configure(lambda cfg: setattr(cfg.head, "kill_grace_s", 1.0))
    with running(live, nodes=1, fake_gpus="2") as live:
        job = live.submit("--wrap", "trap 'echo $$ > usr1.txt' USR1; "
                          "trap 'echo $$ > usr2.txt' USR2; echo $$ > ready.txt; "
                          "while true; do sleep 0.1; done")
        live.wait_state(job, "RUNNING")
        wait_for(lambda: (live.work / "ready.txt").exists(), "the job's traps to be set")
        assert live.gq("cancel", "--signal", "USR1", str(job)).returncode == 0
        wait_for(lambda: (live.work / "usr1.txt").exists(), "the job to trap SIGUSR1")
        # No SIGKILL follows: still running well past the 1 s kill grace.
        until = time.monotonic() + 3
        while time.monotonic() < until:
            assert live.show(job)["state"] == "RUNNING"
            time.sleep(0.2)
        assert not live.run_ended("node1", job)
        # -b: the script itself (scancel -b), here the shell that traps it.
        assert live.gq("cancel", "-b", "-s", "SIGUSR2", str(job)).returncode == 0
        wait_for(lambda: (live.work / "usr2.txt").exists(), "the job to trap SIGUSR2")
        assert live.show(job)["state"] == "RUNNING"

        assert live.gq("cancel", "--signal", "NOPE", str(job)).returncode == 2
        assert live.gq("cancel", "-b", str(job)).returncode == 2
        held = live.submit("--hold", "--wrap", "true")
        pending = live.gq("cancel", "--signal", "USR1", str(held))
        assert pending.returncode == 1 and "not running" in pending.stderr

        # A plain cancel still ends it.
        assert live.gq("cancel", str(job)).returncode == 0
        live.wait_state(job, "CANCELLED")
        wait_for(lambda: live.settled("node1"), "the run to end on its node")
        live.gq("cancel", str(held), check=True)


def _epoch(iso: str) -> float:
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))
