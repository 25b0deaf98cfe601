"""Queue limits: per-user QOS limits (Slurm's MaxSubmitJobsPerUser, MaxJobsPerUser,
MaxTRESPerUser=gres/gpu) and the global queue cap.

Submit limits refuse at submit, naming the limit; running and GPU limits keep a job out of the
scheduler's snapshot with reason `QOSLimit` until the user's other jobs end. Live jobs are counted
as they enter and leave the head's memory, so a submit costs no scan of the queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gq import defaults
from gq.arrays import parse_array
from gq.config import Config, QosConfig
from gq.errors import RefusedError
from gq.model import Job, JobSpec, JobState

#: The pending reason of a job held back by a running or GPU limit (Slurm's name).
QOS_LIMIT = "QOSLimit"

Key = tuple[str, str]


def _key(spec: JobSpec) -> Key:
    return spec.user, spec.qos or defaults.DEFAULT_QOS


class Queued:
    """Live jobs (pending or running) per (user, QOS); adding or removing a job twice is safe."""

    def __init__(self) -> None:
        self.by_key: Counter[Key] = Counter()
        self._keys: dict[int, Key] = {}

    def add(self, job: Job) -> None:
        if job.id not in self._keys and not job.state.terminal:
            self._keys[job.id] = key = _key(job.spec)
            self.by_key[key] += 1

    def remove(self, job: Job) -> None:
        key = self._keys.pop(job.id, None)
        if key is not None:
            self.by_key[key] -= 1
            if not self.by_key[key]:
                del self.by_key[key]

    def __len__(self) -> int:
        return len(self._keys)


def check_submit(cfg: Config, queued: Queued, specs: list[JobSpec]) -> None:
    """Refuse, naming the limit, a submit that would take the queue past a limit."""
    adding: Counter[Key] = Counter()
    for spec in specs:
        adding[_key(spec)] += len(parse_array(spec.array).indices) if spec.array else 1
        qos = cfg.qos[_key(spec)[1]]
        want = spec.nodes * spec.gpus
        if qos.max_gpus_per_user and want > qos.max_gpus_per_user:
            raise RefusedError(f"the job asks for {want} GPUs; QOS {spec.qos!r} allows "
                               f"{qos.max_gpus_per_user} per user (max_gpus_per_user, "
                               "Slurm's MaxTRESPerUser=gres/gpu)")
    cap = cfg.head.max_queued_jobs
    total = sum(adding.values())
    if cap and len(queued) + total > cap:
        raise RefusedError(f"the queue is full: {len(queued)} jobs queued, this submit adds "
                           f"{total}, and gqd holds at most {cap} ([head] max_queued_jobs); "
                           "try again later")
    for (user, name), count in adding.items():
        limit = cfg.qos[name].max_submit_per_user
        have = queued.by_key[(user, name)]
        if limit and have + count > limit:
            raise RefusedError(f"QOS {name!r} allows {limit} queued or running jobs per user "
                               f"(max_submit_per_user, Slurm's MaxSubmitJobsPerUser); {user} "
                               f"has {have} and this submit adds {count}")


def screen(eligible: list[Job], live: Iterable[Job], qos: dict[str, QosConfig]
           ) -> tuple[list[Job], list[Job]]:
    """(jobs the scheduler may start, jobs held back with QOSLimit) among the eligible ones.

    The running jobs' use is counted, then pending jobs (oldest first) are admitted while the
    user's running count and GPUs, plus those of jobs admitted before them, stay in the limits:
    whatever the scheduler starts of the admitted jobs, no limit is passed.
    """
    limited_qos = {n for n, q in qos.items() if q.max_running_per_user or q.max_gpus_per_user}
    if not limited_qos or not eligible:
        return eligible, []
    jobs: Counter[Key] = Counter()
    gpus: Counter[Key] = Counter()
    for job in live:
        key = _key(job.spec)
        if job.state == JobState.RUNNING and key[1] in limited_qos:
            jobs[key] += 1
            gpus[key] += job.spec.nodes * job.spec.gpus
    admitted, held = [], []
    for job in eligible:
        key = _key(job.spec)
        limits = qos.get(key[1])
        if key[1] in limited_qos and limits is not None:
            want = job.spec.nodes * job.spec.gpus
            if (limits.max_running_per_user and jobs[key] + 1 > limits.max_running_per_user) or (
                    limits.max_gpus_per_user and gpus[key] + want > limits.max_gpus_per_user):
                held.append(job)
                continue
            jobs[key] += 1
            gpus[key] += want
        admitted.append(job)
    return admitted, held
