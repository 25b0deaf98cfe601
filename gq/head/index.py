"""The head's live jobs filed by what its passes, timers and metrics look up, kept as jobs change.

Every change to a job in memory is followed by `update(job)` (the job table's `_refile`), so a
pass walks the pending jobs that are not held, and a node event the jobs on that node, instead
of scanning the whole queue: 95,000 held jobs cost nothing per pass. Every list comes in the
order of the head's `jobs` dict (the order the jobs entered memory), as a scan of it would.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

from gq import defaults
from gq.head import gate
from gq.model import Job, JobState

#: (user, job name): a singleton dependency waits for the first live job of its key.
NameKey = tuple[str, str]


@dataclass(frozen=True, slots=True)  # one per live job: 100k of them
class _Filed:
    """What the index filed a job under; `update` compares it with the job's fields now."""

    seq: int
    state: JobState
    hold: str
    qos: str
    name: NameKey
    array: int | None
    #: The nodes of its allocation (empty unless it runs or still holds GPUs).
    nodes: tuple[str, ...]
    #: It runs, holds GPUs or has an allocation: the only jobs any node lookup can match.
    placed: bool


def _filing(job: Job, seq: int) -> _Filed:
    spec = job.spec
    return _Filed(seq, job.state, job.hold, spec.qos or defaults.DEFAULT_QOS,
                  (spec.user, spec.name), job.array_job_id, tuple(job.alloc),
                  bool(job.alloc) or job.holds_alloc or job.state == JobState.RUNNING)


class _InOrder:
    """Jobs by their entry number: iterated in the order they entered the head's memory."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job] = {}
        self._last = -1
        self._sorted = True

    def add(self, seq: int, job: Job) -> None:
        if seq < self._last:
            self._sorted = False  # a job back in the queue: sorted again when next read
        self._last = max(self._last, seq)
        self._jobs[seq] = job

    def discard(self, seq: int) -> None:
        self._jobs.pop(seq, None)

    def jobs(self) -> list[Job]:
        if not self._sorted:
            self._jobs = dict(sorted(self._jobs.items()))
            self._sorted = True
        return list(self._jobs.values())

    def __len__(self) -> int:
        return len(self._jobs)


class JobIndex:
    """The live jobs of a `Head`, filed for its lookups; see the module docstring."""

    def __init__(self) -> None:
        self._filed: dict[int, _Filed] = {}
        self._seq = 0
        #: Pending jobs not held.
        self._ready = _InOrder()
        #: Held pending jobs the pass has not seen since they were held: they get their reason.
        self._fresh: dict[int, Job] = {}
        #: Hold kind -> held pending jobs the pass has seen (their reason is their hold's).
        self._held: Counter[str] = Counter()
        #: Jobs that run, hold GPUs or have an allocation; and the same per node of theirs.
        self._placed = _InOrder()
        self._on_node: dict[str, _InOrder] = {}
        #: Array job id -> its running tasks.
        self._array_running: Counter[int] = Counter()
        #: (user, name) -> heap of the ids of its live jobs (with ids no longer so, dropped
        #: when they reach the top), and how many are live.
        self._named: dict[NameKey, list[int]] = {}
        self._named_live: Counter[NameKey] = Counter()
        #: (state, QOS) -> live jobs.
        self._depth: Counter[tuple[JobState, str]] = Counter()

    # ------------------------------------------------------------ changes

    def add(self, job: Job, seq: int | None = None) -> None:
        """A job entered the head's memory (adding one already there changes nothing); with
        `seq`, one coming back where it was (a rollback: see `seq`)."""
        if job.id not in self._filed:
            if seq is None:
                seq = self._seq
                self._seq += 1
            self._file(job, _filing(job, seq))

    def seq(self, job_id: int) -> int:
        """Where a job in the index stands in the order jobs entered memory."""
        return self._filed[job_id].seq

    def update(self, job: Job) -> None:
        """A job in memory changed (state, hold, spec or allocation): file it anew."""
        old = self._filed.get(job.id)
        if old is not None:
            new = _filing(job, old.seq)
            if new != old:
                self._unfile(job, old)
                self._file(job, new)

    def drop(self, job: Job) -> None:
        """A job left the head's memory."""
        old = self._filed.get(job.id)
        if old is not None:
            self._unfile(job, old)
            del self._filed[job.id]

    def _file(self, job: Job, f: _Filed) -> None:
        self._filed[job.id] = f
        if f.state == JobState.PENDING:
            if f.hold:
                self._fresh[job.id] = job
            else:
                self._ready.add(f.seq, job)
        elif f.state == JobState.RUNNING and f.array is not None:
            self._array_running[f.array] += 1
        if f.placed:
            self._placed.add(f.seq, job)
            for node in f.nodes:
                self._on_node.setdefault(node, _InOrder()).add(f.seq, job)
        if not f.state.terminal:
            self._depth[(f.state, f.qos)] += 1
            heapq.heappush(self._named.setdefault(f.name, []), job.id)
            self._named_live[f.name] += 1

    def _unfile(self, job: Job, f: _Filed) -> None:
        if f.state == JobState.PENDING:
            if not f.hold:
                self._ready.discard(f.seq)
            elif self._fresh.pop(job.id, None) is None:
                _decrement(self._held, f.hold)
        elif f.state == JobState.RUNNING and f.array is not None:
            _decrement(self._array_running, f.array)
        if f.placed:
            self._placed.discard(f.seq)
            for node in f.nodes:
                on_node = self._on_node[node]
                on_node.discard(f.seq)
                if not len(on_node):
                    del self._on_node[node]
        if not f.state.terminal:
            _decrement(self._depth, (f.state, f.qos))
            _decrement(self._named_live, f.name)
            self._compact(f.name)

    def _compact(self, name: NameKey) -> None:
        """Rebuild a name's heap once most of it is ids no longer live there (amortised O(1))."""
        heap = self._named[name]
        live = self._named_live.get(name, 0)
        if not live:
            del self._named[name]
        elif len(heap) > 2 * live + 16:
            self._named[name] = sorted({i for i in heap if self._lives_as(i, name)})

    def _lives_as(self, job_id: int, name: NameKey) -> bool:
        f = self._filed.get(job_id)
        return f is not None and not f.state.terminal and f.name == name

    # ------------------------------------------------------------ lookups

    def ready(self) -> list[Job]:
        """Pending jobs not held, in queue order."""
        return self._ready.jobs()

    def take_fresh(self) -> list[Job]:
        """Held pending jobs not handed out since they were held (the pass gives them their
        reason, which only a change of hold changes); later calls leave them out."""
        fresh = list(self._fresh.values())
        for job in fresh:
            self._held[self._filed[job.id].hold] += 1
        self._fresh.clear()
        return fresh

    def seen(self, job_id: int) -> bool:
        """A held pending job that `take_fresh` handed out since its hold."""
        f = self._filed.get(job_id)
        return f is not None and f.state == JobState.PENDING and bool(f.hold) \
            and job_id not in self._fresh

    def see(self, job: Job) -> None:
        """Count a held job as handed out again (it was, before a change now rolled back)."""
        f = self._filed.get(job.id)
        if f is not None and self._fresh.pop(job.id, None) is not None:
            self._held[f.hold] += 1

    def untake(self, fresh: list[Job]) -> None:
        """Undo a `take_fresh` (its pass was rolled back): those of `fresh` still held and seen
        are handed out again."""
        for job in fresh:
            if self.seen(job.id):
                _decrement(self._held, self._filed[job.id].hold)
                self._fresh[job.id] = job

    def placed(self) -> list[Job]:
        """Jobs that run, hold GPUs or have an allocation, in queue order."""
        return self._placed.jobs()

    def on_node(self, node: str) -> list[Job]:
        """The placed jobs whose allocation has `node`, in queue order."""
        on_node = self._on_node.get(node)
        return on_node.jobs() if on_node is not None else []

    def live(self) -> gate.Live:
        """What gate.screen needs of the whole queue."""
        return gate.Live(running=self._array_running, first=self.first_live)

    def first_live(self, name: NameKey) -> int | None:
        """The smallest id among live jobs of (user, name); None when none is live."""
        heap = self._named.get(name)
        while heap and not self._lives_as(heap[0], name):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def depth(self) -> dict[tuple[str, str], int]:
        """(state, QOS) -> live jobs."""
        return {(state.value, qos): n for (state, qos), n in self._depth.items()}

    def reasons(self) -> Counter[str]:
        """Pending reason -> jobs."""
        out = Counter(j.reason or "None" for j in (*self._ready.jobs(), *self._fresh.values()))
        for hold, n in self._held.items():
            out[gate.held_reason(hold)] += n
        return out


def _decrement(counter: Counter, key: object) -> None:
    counter[key] -= 1
    if not counter[key]:
        del counter[key]
