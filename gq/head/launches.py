"""The runs gqd has sent out, by job: when each launch was sent, which nodes confirmed it and
still hold it, how each rank ended; and when to look again at a launch not yet confirmed.

Kept by the job table (jobs.py), which alone calls what changes it; each change journals its
undo (journal.py) as the table's own changes do.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field

from gq.head.journal import Journal

#: A launch not confirmed by a `started` report in this many seconds is sent again.
LAUNCH_RESEND_S = 5.0


@dataclass
class Launch:
    """Bookkeeping for a job run the head has sent out: which nodes still hold it."""

    #: On the steady clock (JobTable.steady: time.monotonic() in gqd), so that a step of the
    #: wall clock holds back no resend.
    sent_at: float
    confirmed: set[str] = field(default_factory=set)
    holding: set[str] = field(default_factory=set)
    #: Per rank node -> (state, exit code) once it reported finished.
    results: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    #: What the run used on the nodes that reported it: the most memory of any, CPU seconds
    #: of all (None: no node said).
    max_rss: int | None = None
    cpu_s: float | None = None

    def add_usage(self, rss: int | None, cpu: float | None) -> None:
        if rss is not None:
            self.max_rss = max(self.max_rss or 0, rss)
        if cpu is not None and cpu >= 0:
            self.cpu_s = (self.cpu_s or 0.0) + cpu


class Launches(dict[int, Launch]):
    """Job id -> its run's Launch; read as a dict, changed through the methods below."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal
        #: Heap of (sent_at, job id): when each launch was sent, for resending unconfirmed
        #: ones. An entry whose launch was sent again since, or is gone, is skipped (so a
        #: rolled-back entry may stay: it no longer matches its launch).
        self.resends: list[tuple[float, int]] = []

    def put(self, job_id: int, launch: Launch) -> None:
        self._keep(job_id)
        self[job_id] = launch

    def drop(self, job_id: int) -> None:
        self._keep(job_id)
        self.pop(job_id, None)

    def confirm(self, job_id: int, node: str) -> None:
        """`node` runs (or ran) its rank."""
        self._keep(job_id)
        self[job_id].confirmed.add(node)

    def rank_ended(self, job_id: int, node: str, state: str, code: int | None,
                   rss: int | None = None, cpu: float | None = None) -> Launch:
        """The rank on `node` ended (`state`, `code`, having used `rss` bytes at most and `cpu`
        CPU seconds, where the node knows); the run's Launch."""
        self._keep(job_id)
        launch = self[job_id]
        launch.confirmed.add(node)
        launch.holding.discard(node)
        launch.results[node] = (state, code)
        launch.add_usage(rss, cpu)
        return launch

    def sent(self, job_id: int, now: float) -> None:
        """The launch was (sent) again at `now` (steady clock)."""
        self._keep(job_id)
        self[job_id].sent_at = now
        self.remind(job_id)

    def remind(self, job_id: int) -> None:
        """Look at the job's launch again LAUNCH_RESEND_S after it was sent."""
        heapq.heappush(self.resends, (self[job_id].sent_at, job_id))

    def due(self, now: float) -> list[int]:
        """The jobs whose launch went unconfirmed for LAUNCH_RESEND_S by `now` (steady clock),
        taken off the heap."""
        out = []
        while self.resends and now - self.resends[0][0] > LAUNCH_RESEND_S:
            entry = heapq.heappop(self.resends)
            self.journal.record(functools.partial(heapq.heappush, self.resends, entry))
            sent_at, job_id = entry
            launch = self.get(job_id)
            if launch is not None and launch.sent_at == sent_at:
                out.append(job_id)
        return out

    def _keep(self, job_id: int) -> None:
        """Journal the job's launch (or that it has none) before it changes."""
        launch = self.get(job_id)
        if launch is None:
            self.journal.record(lambda: self.pop(job_id, None))
            return
        was = (launch.sent_at, set(launch.confirmed), set(launch.holding), dict(launch.results),
               launch.max_rss, launch.cpu_s)

        def undo() -> None:
            (launch.sent_at, launch.confirmed, launch.holding, launch.results, launch.max_rss,
             launch.cpu_s) = was
            self[job_id] = launch
        self.journal.record(undo)
