"""Arrays, dependencies, hold/release/requeue, --begin, history and report, on a live cluster
through the real CLI (issue 6, Done when 1)."""

from __future__ import annotations

import calendar
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import LiveCluster, wait_for

#: A task that records when it started and ended (its own clock), keyed by its id.
TIMED = 'date +%s.%N > start.{key}; sleep {sleep}; date +%s.%N > end.{key}'
#: Put before a job's command: it then runs only once the test creates the file `go`, so that
#: what waits behind it can be looked at without racing it.
AWAIT_GO = "while [ ! -f go ]; do sleep 0.05; done; "


def _span(work: Path, key: str) -> tuple[float, float]:
    return float((work / f"start.{key}").read_text()), float((work / f"end.{key}").read_text())


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of spans that overlap at one instant."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda ev: (ev[0], ev[1]))
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def _epoch(iso: str) -> int:
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def _json(cluster: LiveCluster, *args: str) -> dict:
    return json.loads(cluster.gq(*args, "--json", check=True).stdout)


def test_throttled_array_never_runs_more_than_two_tasks(cluster: LiveCluster) -> None:
    array = cluster.submit("--array", "0-5%2", "-o", "arr.%A.%a.out", "--wrap",
                           AWAIT_GO + TIMED.format(key="$GQ_ARRAY_TASK_ID", sleep=0.5)
                           + "; echo $GQ_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID")
    for task in (f"{array}_0", f"{array}_1"):
        cluster.wait_state(task, "RUNNING")
    # The queue folds the waiting tasks into one line, with the limit.
    lines = cluster.gq("queue", check=True).stdout.splitlines()
    if not any(f"{array}_[2-5%2]" in ln and "JobArrayTaskLimit" in ln for ln in lines):
        # pytest.fail, not assert: pytest would cut the diagnosis short.
        pytest.fail("\n".join([*lines, *(str((j["id"], j["state"], j["exit_code"], j["reason"]))
                                         for j in _json(cluster, "history")["jobs"]),
                               cluster.log_tails("node1")]))
    tasks = [j for j in _json(cluster, "queue")["jobs"] if j["array_job_id"] == array]
    assert sorted((j["array_task_id"], j["state"]) for j in tasks) == [
        (0, "RUNNING"), (1, "RUNNING"), *((i, "PENDING") for i in range(2, 6))]
    (cluster.work / "go").touch()
    with cluster.client() as c:
        done = c.wait([array], timeout_s=120)  # an array's id waits for all its tasks
    assert sorted(j["array_task_id"] for j in done) == list(range(6))
    assert {j["state"] for j in done} == {"COMPLETED"}
    assert [j["id"] for j in sorted(done, key=lambda j: j["array_task_id"])] == \
        list(range(array, array + 6)), "tasks take the ids after the array's"
    spans = [_span(cluster.work, str(i)) for i in range(6)]
    assert _most_at_once(spans) == 2, spans
    task = cluster.show(f"{array}_3")
    assert (task["id"], task["job_id"], task["array_index"]) == (array + 3, f"{array}_3", 3)
    out = cluster.work / f"arr.{array}.3.out"
    assert out.read_text().split() == [str(array), "3"]


def test_array_submit_cancel_one_task_and_the_whole_array(cluster: LiveCluster) -> None:
    array = cluster.submit("--array", "1,3,7", "--hold", "--wrap", "true")
    assert cluster.gq("cancel", f"{array}_3").returncode == 0
    assert cluster.show(f"{array}_3")["state"] == "CANCELLED"
    assert cluster.show(f"{array}_1")["reason"] == "JobHeldUser"
    assert cluster.gq("cancel", str(array)).returncode == 0
    assert {cluster.show(f"{array}_{i}")["state"] for i in (1, 7)} == {"CANCELLED"}
    missing = cluster.gq("show", f"{array}_2")
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    bad = cluster.gq("submit", "--array", "5-1", "--wrap", "true")
    assert bad.returncode == 2 and "--array" in bad.stderr


def test_afterok_chain_runs_in_order_and_a_failed_parent_never_satisfies(
        cluster: LiveCluster) -> None:
    first = cluster.submit("--wrap", AWAIT_GO + TIMED.format(key="a", sleep=0.5))
    second = cluster.submit("-d", f"afterok:{first}", "--wrap", TIMED.format(key="b", sleep=0))
    third = cluster.submit("--dependency", f"afterok:{second}", "--wrap",
                           TIMED.format(key="c", sleep=0))
    assert [cluster.show(i)["reason"] for i in (second, third)] == ["Dependency"] * 2
    (cluster.work / "go").touch()
    cluster.wait_state(third, "COMPLETED")
    a, b, c = (_span(cluster.work, k) for k in "abc")
    assert a[1] <= b[0] and b[1] <= c[0], (a, b, c)

    failing = cluster.submit("--wrap", "sleep 1; exit 3")
    child = cluster.submit("-d", f"afterok:{failing}", "--wrap", "true")
    killed = cluster.submit("-d", f"afterok:{failing}", "--kill-on-invalid-dep", "yes", "--wrap", "true")
    rescue = cluster.submit("-d", f"afternotok:{failing}", "--wrap", "true")
    either = cluster.submit("-d", f"afterok:{failing}?afterany:{first}", "--wrap", "true")
    cluster.wait_state(failing, "FAILED")
    wait_for(lambda: cluster.show(child)["reason"] == "DependencyNeverSatisfied",
             "the child of a failed parent to be DependencyNeverSatisfied")
    assert cluster.show(child)["state"] == "PENDING", "it stays until cancelled, as in Slurm"
    cluster.wait_state(killed, "CANCELLED")
    cluster.wait_state(rescue, "COMPLETED")
    cluster.wait_state(either, "COMPLETED")
    assert cluster.gq("cancel", str(child)).returncode == 0

    unknown = cluster.gq("submit", "-d", "afterok:999999", "--wrap", "true")
    assert unknown.returncode == 1 and "999999" in unknown.stderr
    assert cluster.gq("submit", "-d", "afterwards:1", "--wrap", "true").returncode == 2


def test_singleton_serialises_same_name_jobs_of_a_user(cluster: LiveCluster) -> None:
    ids = [cluster.submit("-J", "solo", "-d", "singleton", "--wrap",
                          (AWAIT_GO if i == 0 else "") + TIMED.format(key=f"s{i}", sleep=1))
           for i in range(3)]
    other = cluster.submit("-J", "other", "-d", "singleton", "--wrap", "true")
    cluster.wait_state(ids[0], "RUNNING")
    cluster.wait_state(other, "COMPLETED")  # another name is not held back
    assert [cluster.show(i)["reason"] for i in ids[1:]] == ["Dependency", "Dependency"]
    (cluster.work / "go").touch()
    for job_id in ids:
        cluster.wait_state(job_id, "COMPLETED")
    spans = [_span(cluster.work, f"s{i}") for i in range(3)]
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(2)), spans


def test_hold_release_requeue_and_begin(cluster: LiveCluster) -> None:
    held = cluster.submit("--hold", "--wrap", "echo released > held.txt")
    assert cluster.show(held)["reason"] == "JobHeldUser"
    # Scheduling passes come and go (another job runs to the end); the held job stays.
    cluster.wait_state(cluster.submit("--wrap", "true"), "COMPLETED")
    assert cluster.show(held)["state"] == "PENDING"
    assert cluster.gq("release", str(held)).returncode == 0
    cluster.wait_state(held, "COMPLETED")
    again = cluster.gq("release", str(held))
    assert again.returncode == 1 and "not held" in again.stderr

    later = cluster.submit("--begin", "now+1h", "--wrap", "true")
    assert cluster.show(later)["reason"] == "BeginTime"
    assert cluster.gq("hold", str(later)).returncode == 0
    assert cluster.show(later)["reason"] == "JobHeldUser"
    assert cluster.gq("release", str(later)).returncode == 0
    wait_for(lambda: cluster.show(later)["reason"] == "BeginTime", "BeginTime after release")
    cluster.gq("cancel", str(later), check=True)

    before = time.time()
    soon = cluster.submit("-b", "now+3s", "--wrap", "true")
    job = cluster.wait_state(soon, "COMPLETED", timeout=30)
    assert _epoch(job["start_time"]) >= int(before) + 2, job  # ISO times are whole seconds

    running = cluster.submit("--wrap", "echo $GQ_RESTART_COUNT >> runs.txt; sleep 300")
    cluster.wait_state(running, "RUNNING")
    refused = cluster.gq("hold", str(running))
    assert refused.returncode == 1 and "not pending" in refused.stderr
    wait_for(lambda: (cluster.work / "runs.txt").exists(), "the first run to start")
    assert cluster.gq("requeue", str(running)).returncode == 0
    wait_for(lambda: (cluster.work / "runs.txt").read_text().split() == ["0", "1"],
             "the requeued job to run again as run 1")
    assert cluster.show(running)["restart_count"] == 1
    cluster.gq("cancel", str(running), check=True)


def test_holds_and_dependencies_survive_a_gqd_restart(cluster: LiveCluster) -> None:
    parent = cluster.submit("--hold", "--wrap", "true")
    child = cluster.submit("-d", f"afterok:{parent}", "--wrap", "true")
    pid = cluster.head_pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cluster.head_pid() is None, "gqd to die")
    cluster.gq("up", "--nodes", "2", "--fake-gpus", "8", check=True)
    assert cluster.show(parent)["reason"] == "JobHeldUser"
    assert cluster.show(child)["dependency"] == f"afterok:{parent}"
    wait_for(lambda: cluster.show(child)["reason"] == "Dependency", "the child to wait")
    cluster.gq("release", str(parent), check=True)
    cluster.wait_state(child, "COMPLETED")


def test_history_and_report_agree_with_the_jobs_run(cluster: LiveCluster) -> None:
    ok = cluster.submit("-g", "2", "-A", "vision", "--wrap", "sleep 1")
    bad = cluster.submit("-A", "nlp", "--wrap", "sleep 1; exit 1")
    late = cluster.submit("-t", "1s", "--wrap", "sleep 60")
    for job_id in (ok, bad, late):
        cluster.wait_state(job_id, "COMPLETED", "FAILED", "TIMEOUT")
    # A preempted run counts as wasted though its job runs again: fill both nodes with free
    # work, then a pro job takes one of them.
    cluster.reconfigure("[scheduler]\npreempt_exempt_s = 0")
    free = [cluster.submit("-q", "free", "-g", "8", "-t", "1h", "--wrap", "sleep 300")
            for _ in range(2)]
    for job_id in free:
        cluster.wait_state(job_id, "RUNNING")
    pro = cluster.submit("-q", "pro", "-g", "8", "-t", "10m", "--wrap", "sleep 1")
    cluster.wait_state(pro, "COMPLETED")
    victim = next(j for j in free if cluster.show(j)["restart_count"] == 1)
    cluster.gq("cancel", *map(str, free), check=True)

    history = _json(cluster, "history", "--since", "now-10m")
    by_id = {j["id"]: j for j in history["jobs"]}
    assert history["schema_version"] == 1
    assert {by_id[i]["state"] for i in (ok, bad, late)} == {"COMPLETED", "FAILED", "TIMEOUT"}
    assert by_id[ok]["account"] == "vision" and by_id[ok]["gpus_per_node"] == 2
    failed = _json(cluster, "history", "--since", "now-10m", "--state", "F,TO")["jobs"]
    assert sorted(j["id"] for j in failed) == sorted([bad, late])
    parsable = cluster.gq("history", "--since", "now-10m", "--parsable", check=True).stdout
    header, *rows = parsable.splitlines()
    assert header.split("|")[:3] == ["JobID", "JobName", "User"]
    assert any(r.split("|")[0] == str(ok) and "COMPLETED" in r.split("|") for r in rows)

    report = _json(cluster, "report", "--since", "now-10m")
    assert report["schema_version"] == 1

    def gpu_hours(job: dict) -> float:
        seconds = _epoch(job["end_time"]) - _epoch(job["start_time"])
        return job["gpus_per_node"] * job["nodes"] * seconds / 3600

    # Whole-second ISO times against the store's exact ones: allow a second per GPU and run.
    slack = lambda gpus: gpus * 1.01 / 3600  # noqa: E731
    cause = report["wasted_by_cause"]
    assert abs(cause["failed"] - gpu_hours(by_id[bad])) <= slack(1)
    assert abs(cause["timeout"] - gpu_hours(by_id[late])) <= slack(1)
    assert cause["preempted"] > 0, f"job {victim}'s preempted run is not counted"
    accounts = {r["account"]: r for r in report["by_account"]}
    assert abs(accounts["vision"]["gpu_hours"] - gpu_hours(by_id[ok])) <= slack(2)
    assert accounts["vision"]["wasted_gpu_hours"] == 0
    assert abs(accounts["nlp"]["wasted_gpu_hours"] - gpu_hours(by_id[bad])) <= slack(1)
    assert abs(report["wasted_gpu_hours"] - sum(cause.values())) < 1e-6
    qos = {r["qos"]: r for r in report["by_qos"]}
    assert abs(qos["free"]["wasted_gpu_hours"] - cause["preempted"]) < 1e-6
    assert abs(sum(r["gpu_hours"] for r in report["by_user"]) - report["gpu_hours"]) < 1e-6
    text = cluster.gq("report", "--since", "now-10m", check=True).stdout
    assert "wasted" in text and "vision" in text
