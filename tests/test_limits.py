"""Queue limits on a live cluster: per-user QOS submit, running and GPU limits, and the global cap."""

from __future__ import annotations

from pathlib import Path

from gq import config as config_mod
from gq.config import QosConfig
from gq.head import limits
from gq.model import Job, JobSpec, JobState
from tests.conftest import LiveCluster, prepare, running, wait_for


#: The QOS tables, as a sysadmin adds them (the built-in ones plus per-user limits).
LIMITS = """
[qos.normal]
priority = 10
max_submit_per_user = 3
max_running_per_user = 1
[qos.pro]
priority = 100
preempts = ["free"]
max_gpus_per_user = 4
[qos.free]
priority = 1
"""


def _capped(cfg: config_mod.Config) -> None:
    cfg.head.max_queued_jobs = 6


def _gated(live: LiveCluster, name: str, *args: str) -> int:
    """A job that runs until the test creates its go file."""
    return live.submit("-J", name, *args, "--wrap",
                       f"while [ ! -e go.{name} ]; do sleep 0.1; done")


def _reason(live: LiveCluster, job_id: int, reason: str) -> bool:
    job = live.show(job_id)
    return job["state"] == "PENDING" and job["reason"] == reason


def test_per_user_submit_running_and_gpu_limits_and_the_queue_cap(tmp_path: Path) -> None:
    live = prepare(tmp_path)
    live.configure(_capped)
    with running(live, nodes=1, fake_gpus="8") as live:
        live.reconfigure(LIMITS)
        first = _gated(live, "first")
        live.wait_state(first, "RUNNING")
        second = _gated(live, "second")
        third = _gated(live, "third")
        # Over max_running_per_user: it waits, with Slurm's reason, although GPUs are free.
        wait_for(lambda: _reason(live, second, limits.QOS_LIMIT), "second to wait on QOSLimit")
        refused = live.gq("submit", "--wrap", "true")
        assert refused.returncode == 1
        assert "max_submit_per_user" in refused.stderr and "has 3" in refused.stderr
        # GPUs: 3 in use of 4 allowed in pro; 2 more must wait, 5 can never run.
        big = _gated(live, "big", "-q", "pro", "-g", "3")
        live.wait_state(big, "RUNNING")
        more = _gated(live, "more", "-q", "pro", "-g", "2")
        wait_for(lambda: _reason(live, more, limits.QOS_LIMIT), "more to wait on QOSLimit")
        too_big = live.gq("submit", "-q", "pro", "-g", "5", "--wrap", "true")
        assert too_big.returncode == 1 and "max_gpus_per_user" in too_big.stderr
        # The global cap: 6 jobs are queued at most, whoever's they are.
        _gated(live, "sixth", "-q", "free", "-g", "0")
        full = live.gq("submit", "-q", "free", "--wrap", "true")
        assert full.returncode == 1 and "max_queued_jobs" in full.stderr
        # When the user's running job ends, the held one starts; the same for GPUs.
        (live.work / "go.first").touch()
        live.wait_state(second, "RUNNING")
        assert live.show(third)["reason"] == limits.QOS_LIMIT
        (live.work / "go.big").touch()
        live.wait_state(more, "RUNNING")
        for name in ("second", "third", "more", "sixth"):
            (live.work / f"go.{name}").touch()
        live.wait_state(third, "COMPLETED")


def _job(job_id: int, user: str, state: JobState = JobState.PENDING, gpus: int = 1) -> Job:
    return Job(id=job_id, spec=JobSpec(script="", user=user, qos="normal", gpus=gpus),
               state=state)


def test_screen_admits_oldest_jobs_within_the_running_and_gpu_limits() -> None:
    qos = {"normal": QosConfig(max_running_per_user=2, max_gpus_per_user=4)}
    running_jobs = [_job(1, "ann", JobState.RUNNING, gpus=2)]
    pending = [_job(2, "ann", gpus=2), _job(3, "ann", gpus=1), _job(4, "bo", gpus=4),
               _job(5, "bo", gpus=1)]
    admitted, held = limits.screen(pending, [*running_jobs, *pending], qos)
    assert [j.id for j in admitted] == [2, 4]
    assert [j.id for j in held] == [3, 5]
    assert limits.screen(pending, pending, {"normal": QosConfig()}) == (pending, [])


def test_queued_counts_each_job_once() -> None:
    queued = limits.Queued()
    job = _job(1, "ann")
    queued.add(job)
    queued.add(job)
    assert queued.by_key[("ann", "normal")] == 1 and len(queued) == 1
    queued.remove(job)
    queued.remove(job)
    assert not queued.by_key and len(queued) == 0
