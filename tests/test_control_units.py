"""Unit tests of the pure parts of arrays, dependencies, --begin times and the head's gate."""

from __future__ import annotations

import datetime as dt

import pytest

from gq.arrays import fold, parse_array, parse_ref
from gq.cli.accounting import summarize
from gq.cli.render import fold_pending_tasks
from gq.deps import ParentState, Verdict, evaluate, parse_dependency
from gq.errors import UsageError
from gq.head import gate
from gq.model import Job, JobSpec, JobState, parse_time


@pytest.mark.parametrize("text,indices,throttle", [
    ("0-4", (0, 1, 2, 3, 4), None),
    ("1,3,7", (1, 3, 7), None),
    ("0-9:3", (0, 3, 6, 9), None),
    ("0-99%10", tuple(range(100)), 10),
    ("5,1-2%1", (1, 2, 5), 1),
    # Slurm drops the brackets of a hostlist-like spec (a real script's `--array=[0-4]%2`).
    ("[0-4]%2", (0, 1, 2, 3, 4), 2),
    ("[1,3,5-6]", (1, 3, 5, 6), None),
])
def test_array_specs(text: str, indices: tuple[int, ...], throttle: int | None) -> None:
    spec = parse_array(text)
    assert (spec.indices, spec.throttle) == (indices, throttle)


@pytest.mark.parametrize("text", ["", "5-1", "1-", "a", "0-9%0", "0-9%x", "0-9:0",
                                  "0-200000"])
def test_bad_array_specs_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="--array"):
        parse_array(text)


def test_job_refs_and_folding() -> None:
    assert parse_ref("123") == 123 and parse_ref("123_7") == "123_7"
    for bad in ("0", "x", "1_", "_3", "1_2_3"):
        with pytest.raises(UsageError, match="bad job id"):
            parse_ref(bad)
    assert fold([9, 0, 1, 2, 7, 10, 11]) == "0-2,7,9-11"


def test_dependency_parsing_is_canonical() -> None:
    assert str(parse_dependency("afterok:1:2,afterany:3")) == "afterok:1:2,afterany:3"
    assert str(parse_dependency("AfterOK:1?singleton")) == "afterok:1?singleton"
    for bad in ("afterok", "afterok:x", "before:1", "afterok:1,afterany:2?after:3"):
        with pytest.raises(UsageError, match="--dependency"):
            parse_dependency(bad)


def _parents(**states: str):  # noqa: ANN202
    table = {int(k[1:]): ParentState(v, started=v != "PENDING") for k, v in states.items()}
    return table.__getitem__


@pytest.mark.parametrize("dep,states,verdict", [
    ("afterok:1", {"j1": "RUNNING"}, Verdict.WAITING),
    ("afterok:1", {"j1": "COMPLETED"}, Verdict.MET),
    ("afterok:1", {"j1": "FAILED"}, Verdict.NEVER),
    ("afternotok:1", {"j1": "COMPLETED"}, Verdict.NEVER),
    ("afternotok:1", {"j1": "TIMEOUT"}, Verdict.MET),
    ("afterany:1", {"j1": "CANCELLED"}, Verdict.MET),
    ("after:1", {"j1": "PENDING"}, Verdict.WAITING),
    ("after:1", {"j1": "RUNNING"}, Verdict.MET),
    ("afterok:1:2", {"j1": "COMPLETED", "j2": "RUNNING"}, Verdict.WAITING),
    ("afterok:1,afterany:2", {"j1": "FAILED", "j2": "RUNNING"}, Verdict.NEVER),
    ("afterok:1?afterany:2", {"j1": "FAILED", "j2": "RUNNING"}, Verdict.WAITING),
    ("afterok:1?afterany:2", {"j1": "FAILED", "j2": "FAILED"}, Verdict.MET),
    ("afterok:1?afternotok:2", {"j1": "FAILED", "j2": "COMPLETED"}, Verdict.NEVER),
])
def test_dependency_verdicts(dep: str, states: dict[str, str], verdict: Verdict) -> None:
    assert evaluate(parse_dependency(dep), _parents(**states), singleton_clear=True) == verdict


def test_times_for_begin_and_since() -> None:
    now = dt.datetime(2026, 11, 30, 15, 0, 0).astimezone().timestamp()
    assert parse_time("now+1h", now) == now + 3600
    assert parse_time("now+30", now) == now + 30
    assert parse_time("now-2d", now) == now - 2 * 86400
    four = dt.datetime(2026, 11, 30, 16, 0).astimezone().timestamp()
    assert parse_time("16:00", now, future=True) == four
    assert parse_time("14:00", now, future=True) == four - 7200 + 86400  # tomorrow's
    assert parse_time("14:00", now) == four - 7200                       # today's, for --since
    assert parse_time("2026-12-01T00:00:00Z", now) == dt.datetime(
        2026, 12, 1, tzinfo=dt.timezone.utc).timestamp()
    for bad in ("soon", "now+1y", "25:00"):
        with pytest.raises(UsageError, match="bad time"):
            parse_time(bad, now)


def _job(job_id: int, state: JobState = JobState.PENDING, **spec: object) -> Job:
    array = spec.pop("array_job_id", None)
    return Job(id=job_id, spec=JobSpec(script="#!/bin/sh\n", user="ann", **spec), state=state,
               array_job_id=array, array_index=job_id - array if array else None)


def test_gate_reasons_in_slurm_order() -> None:
    jobs = [
        _job(1, hold=True, begin_time=2000.0),
        _job(2, begin_time=2000.0),
        _job(3, begin_time=500.0),
        _job(4, dependency="afterok:9"),
        _job(5, dependency="afterok:8", kill_on_invalid_dep=True),
    ]
    jobs[0].hold = "admin"
    parents = _parents(j9="RUNNING", j8="FAILED")
    out = gate.screen(jobs, now=1000.0, parent=parents)
    assert [j.id for j in out.eligible] == [3]
    assert {j.id: r for j, r in out.waiting} == {
        1: "JobHeldAdmin", 2: "BeginTime", 4: "Dependency", 5: "DependencyNeverSatisfied"}
    assert [j.id for j in out.invalid] == [5]
    assert out.wake_at == 2000.0


def test_gate_throttles_arrays_and_serialises_singletons() -> None:
    tasks = [_job(10 + i, JobState.RUNNING if i == 0 else JobState.PENDING, array="0-4%2",
                  array_job_id=10) for i in range(5)]
    solo = [_job(20 + i, name="solo", dependency="singleton") for i in range(2)]
    out = gate.screen([*tasks, *solo], now=0.0, parent=_parents())
    assert [j.id for j in out.eligible] == [11, 20]
    assert {j.id: r for j, r in out.waiting} == {12: "JobArrayTaskLimit",
                                                13: "JobArrayTaskLimit",
                                                14: "JobArrayTaskLimit", 21: "Dependency"}


def test_queue_folds_pending_tasks_like_squeue() -> None:
    jobs = [_job(10 + i, JobState.RUNNING if i < 2 else JobState.PENDING, array="0-9%2",
                 array_job_id=10).to_json() for i in range(10)]
    jobs.append(_job(30).to_json())
    assert [job_id for _, job_id in fold_pending_tasks(jobs)] == ["10_0", "10_1", "10_[2-9%2]",
                                                                 "30"]


def test_report_sums_use_and_waste() -> None:
    rows = [{"user": "ann", "account": "a", "qos": "free", "state": "PREEMPTED",
             "gpu_seconds": 3600},
            {"user": "ann", "account": "a", "qos": "normal", "state": "COMPLETED",
             "gpu_seconds": 7200},
            {"user": "bob", "account": "", "qos": "normal", "state": "TIMEOUT",
             "gpu_seconds": 1800}]
    data = summarize(rows)
    assert (data["gpu_hours"], data["wasted_gpu_hours"]) == (3.5, 1.5)
    assert data["wasted_by_cause"] == {"preempted": 1.0, "failed": 0.0, "timeout": 0.5,
                                       "node_fail": 0.0}
    assert data["by_user"] == [{"user": "ann", "gpu_hours": 3.0, "wasted_gpu_hours": 1.0},
                               {"user": "bob", "gpu_hours": 0.5, "wasted_gpu_hours": 0.5}]


def test_store_keeps_arrays_holds_and_runs(tmp_path) -> None:  # noqa: ANN001
    from gq.store import Store
    store = Store(tmp_path / "gq.db")
    try:
        spec = JobSpec(script="#!/bin/sh\n", user="ann", gpus=2, qos="normal", account="vis",
                       array="0-2", env={"BIG": "x" * 1000})
        tasks = [Job(id=0, spec=spec, submit_time=1.0, array_index=i, hold="user")
                 for i in range(3)]
        with store.tx():
            store.add_jobs(tasks, array=True)
        first = tasks[0].id
        assert [t.id for t in tasks] == [first, first + 1, first + 2]
        task = store.array_task(first, 2)
        assert (task.id, task.array_job_id, task.hold, task.spec.env["BIG"]) == \
            (first + 2, first, "user", "x" * 1000)
        assert [j.array_index for j in store.live_jobs()] == [0, 1, 2]
        job = tasks[1]
        job.state, job.start_time = JobState.RUNNING, 100.0
        with store.tx():
            store.insert_run(job, 200.0, "PREEMPTED")
            job.restart_count, job.start_time = 1, 300.0
            store.insert_run(job, 400.0, "COMPLETED")
        assert store.run_usage(150.0, 1000.0) == [("ann", "vis", "normal", "COMPLETED", 200.0),
                                                  ("ann", "vis", "normal", "PREEMPTED", 100.0)]
    finally:
        store.close()
