"""Which powered-down nodes to resume for the pending jobs (power saving, gq/head/power.py).

Pure: the jobs still pending after a pass, the nodes already powering up and the nodes powered
down go in; the names to resume come out. The pending jobs are taken in the order given (the
head gives them by submit time), and each is laid, rank by rank on distinct nodes, onto what
nodes powering up (and nodes chosen earlier in this call) still have free, else onto a powered-
down node, which is then chosen: so a burst of jobs resumes just enough nodes, and a job that no
declared node could hold resumes none. Fit is the scheduler's own test (`placement.gpu_fits`:
GPU type and VRAM), with the job's allowed nodes (partition, -w/-x, --constraint), CPUs and
memory (a declared node that names no CPUs or memory is taken to have enough). A job holds its
GPUs alone here even if it would share them (`--share`): resuming a node too many is the cheaper
mistake.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gq.model import Gpu
from gq.sched.placement import gpu_fits
from gq.sched.types import PendingJob


@dataclass
class Room:
    """What a node powering up, or to be resumed, will have left for the jobs laid on it."""

    name: str
    gpus: list[Gpu]
    cpus: int = 0
    mem: int = 0
    #: 0 above: the node declares none (not counted).
    counted: tuple[bool, bool] = field(default=(True, True))

    @classmethod
    def of(cls, name: str, gpus: Sequence[Gpu], cpus: int, mem: int) -> Room:
        return cls(name, sorted(gpus, key=lambda g: (g.memory, g.index)), cpus, mem,
                   (cpus > 0, mem > 0))

    def fits(self, job: PendingJob) -> list[Gpu] | None:
        """The GPUs one rank of the job would take here (smallest VRAM that fits first), or
        None if it does not fit."""
        if job.allowed is not None and self.name not in job.allowed:
            return None
        if (self.counted[0] and job.cpus > self.cpus) or (self.counted[1] and job.mem > self.mem):
            return None
        fitting = [g for g in self.gpus if gpu_fits(g, job)]
        return fitting[:job.gpus] if len(fitting) >= job.gpus else None

    def take(self, job: PendingJob, gpus: list[Gpu]) -> None:
        taken = {g.index for g in gpus}
        self.gpus = [g for g in self.gpus if g.index not in taken]
        self.cpus -= job.cpus
        self.mem -= job.mem


def to_resume(pending: Iterable[PendingJob], powering: Iterable[Room], down: Iterable[Room],
              limit: int | None = None, placed: dict[int, list[str]] | None = None
              ) -> list[str]:
    """Names of the powered-down nodes (`down`, in the order given: the head gives the fewest
    GPUs first, then by name) to resume so that the pending jobs fit, at most `limit` (None: no
    limit); see the module's docstring. `placed`, if given, gets the rooms each job was laid
    on, by job id (the nodes it waits for: its pending reason)."""
    pool = list(powering)
    spare = list(down)
    chosen: list[str] = []
    for job in pending:
        if limit is not None and len(chosen) >= limit:
            break
        ranks = max(job.nodes, 1)
        picks: list[tuple[Room, list[Gpu]]] = []
        # Room that is coming anyway first, then as few new nodes as the job needs.
        for room in pool:
            if len(picks) < ranks and (gpus := room.fits(job)) is not None:
                picks.append((room, gpus))
        new = []
        for room in spare:
            if len(picks) >= ranks:
                break
            if (gpus := room.fits(job)) is not None:
                picks.append((room, gpus))
                new.append(room)
        if len(picks) < ranks or (limit is not None and len(chosen) + len(new) > limit):
            continue  # no declared nodes could hold it (or not within the rate): none for it
        for room, gpus in picks:
            room.take(job, gpus)
        if placed is not None:
            placed[job.id] = [room.name for room, _ in picks]
        for room in new:
            spare.remove(room)
            pool.append(room)
            chosen.append(room.name)
    return chosen
