"""`gq sim --autoscale`: power saving replayed, queue delay against node-hours powered (issue 20;
docs/SCHEDULING.md "Autoscaling").

The engine's nodes may be off. A node that is not UP is shown to the scheduler unschedulable,
as gqd shows a POWERED_DOWN or POWERING_UP node (no start, no reservation there), and the
engine refuses a start on one (SimInvariantError). After each instant's pass, as gqd's loop
turn does after its pass:

- the jobs still pending are laid onto what is free on UP nodes, what booting nodes will have,
  then onto nodes that are off, by gqd's own choice (`gq.sched.resume.to_resume`, the pure
  function gq/head/power.py calls), at most `resume_rate` nodes a minute; each node chosen boots
  for `boot_s` (ResumeProgram until the node registers) and is UP from then;
- an UP node that has held no job for `suspend_time_s`, and that no pending job would fit (the
  same `Room.fits` test gqd's suspend makes), is off at once (SuspendProgram's time is not
  modelled: a node stops counting when it is suspended).

A node counts as powered from its resume (its boot is paid for) to its suspend; `always_on`
nodes (the first ones by name) are never off and count from the first submit. The always-on
baseline is the same replay without power saving, counted as every node powered from the first
submit to the last job's end, which favours the baseline: its idle tail is not counted, the
autoscaled run's is (until each node's suspend).
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field, replace

from gq.sched.resume import Room, to_resume
from gq.sched.types import NodeView, Policy, Start
from gq.sim.affinity import ColdStarts
from gq.sim.engine import (Cluster, PolicyFn, ProgressFn, SimInvariantError, SimResult,
                           Simulator)
from gq.sim.trace import TraceJob

UP, BOOTING, OFF = "UP", "BOOTING", "OFF"
#: gqd looks at the demand at most once a second (gq/head/power.py RESUME_EVERY_S), and the
#: rate's window is a minute (RATE_WINDOW_S).
LOOK_EVERY_S = 1.0
RATE_WINDOW_S = 60.0


@dataclass(frozen=True)
class PowerModel:
    #: Seconds from the resume to the node taking jobs (boot, gqnode's registration).
    boot_s: float = 120.0
    #: `[power] suspend_time`: seconds idle before a node is suspended.
    suspend_time_s: float = 600.0
    #: `[power] resume_rate`: nodes resumed a minute at most (0: no limit).
    resume_rate: int = 0
    #: Nodes never powered down (a static pool), the first ones by name.
    always_on: int = 0


@dataclass
class PowerCounts:
    """What power saving did in one replay."""

    node_s: float = 0.0
    resumes: int = 0
    suspends: int = 0
    #: When each resume was (a node each).
    resume_times: list[float] = field(default_factory=list)
    #: Node -> the (from, to) spans it was UP (taking jobs); for the tests' invariant check.
    up_spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


class PoweredSimulator(Simulator):
    """The engine with power states and gqd's resume choice; see the module's docstring."""

    def __init__(self, jobs: list[TraceJob], cluster: Cluster, policy_fn: PolicyFn,
                 policy: Policy | None, power: PowerModel,
                 on_progress: ProgressFn | None = None, loads: ColdStarts | None = None) -> None:
        super().__init__(jobs, cluster, policy_fn, policy, on_progress, loads=loads)
        self.power = power
        self.counts = PowerCounts()
        names = list(self.free)
        self.static = set(names[:power.always_on])
        first = min((j.submit_time for j in jobs), default=0.0)
        self.state = {n: UP if n in self.static else OFF for n in names}
        #: Node -> when it was powered (resumed, or the first submit for a static node); when
        #: it came UP; when a booting one will be UP; since when an UP one has held no job.
        self.on_since = {n: first for n in self.static}
        self.up_since = {n: first for n in self.static}
        self.ready_at: dict[str, float] = {}
        self.idle_since: dict[str, float] = {}
        self.recent: deque[float] = deque()
        self.look_at = -math.inf
        #: The demand changed (arrivals, a node's state) since the last look.
        self.stirred = True
        self.now = first
        for name in names:
            if name not in self.static:
                self._room(name, up=False)

    # ------------------------------------------------------------ the loop

    def run(self) -> SimResult:
        began = time.perf_counter()
        while self.next_arrival < len(self.arrivals) or self.events:
            now = self.now = self._next_time()
            arrived = self.next_arrival
            changed = self._take_instant(now)
            self.stirred |= self.next_arrival != arrived
            if self._booted(now) or changed:
                self._schedule(now)
            self._resume(now)
            self._suspend(now)
        for name, since in self.on_since.items():  # (static nodes, and any still on)
            self.counts.node_s += self.now - since
        for name, since in self.up_since.items():
            self.counts.up_spans.setdefault(name, []).append((since, self.now))
        self.result.wall_s = time.perf_counter() - began
        return self.result

    def _booted(self, now: float) -> bool:
        done = [n for n, at in self.ready_at.items() if at <= now]
        for name in done:
            del self.ready_at[name]
            self._set_state(name, UP)
            self.up_since[name] = now
        return bool(done)

    def _resume(self, now: float) -> None:
        off = [n for n, s in self.state.items() if s == OFF]
        if not (off and self.pending and self.stirred):
            return
        if now < self.look_at:
            self._wake_at(self.look_at)  # (no event may come before then)
            return
        self.look_at, self.stirred = now + LOOK_EVERY_S, False
        while self.recent and now >= self.recent[0] + RATE_WINDOW_S:
            self.recent.popleft()
        limit = len(off)
        if self.power.resume_rate:
            limit = min(limit, self.power.resume_rate - len(self.recent))
            if limit <= 0:
                self._wake_at(self.recent[0] + RATE_WINDOW_S)
                self.stirred = True  # look again when the window lets a node through
                return
        gpus = list(self.gpus)
        pool = [Room.of(n, [g for g in gpus if g.index in self.free[n]], 0, 0)
                for n, s in self.state.items() if s == UP and self.free[n]]
        pool += [Room.of(n, gpus, 0, 0) for n in self.ready_at]
        demand = sorted(self.pending.values(), key=lambda v: (v.submit_time, v.id))
        for name in to_resume(demand, pool, [Room.of(n, gpus, 0, 0) for n in off], limit):
            self._set_state(name, BOOTING)
            self.on_since[name] = now
            self.ready_at[name] = now + self.power.boot_s
            self.recent.append(now)
            self.counts.resumes += 1
            self.counts.resume_times.append(now)
            self._wake_at(now + self.power.boot_s)

    def _suspend(self, now: float) -> None:
        whole = len(self.gpus)
        for name, state in self.state.items():
            if state != UP or name in self.static:
                continue
            if len(self.free[name]) < whole:
                self.idle_since.pop(name, None)
                continue
            due = self.idle_since.setdefault(name, now) + self.power.suspend_time_s
            if now < due:  # (not now - since < suspend_time: rounded, that wakes at now again)
                self._wake_at(due)
                continue
            room = Room.of(name, self.gpus, 0, 0)
            if any(room.fits(v) is not None for v in self.pending.values()):
                # Kept for a job that fits it (gqd's rule): its idle clock starts again.
                self.idle_since[name] = now
                self._wake_at(now + self.power.suspend_time_s)
                continue
            del self.idle_since[name]
            self._set_state(name, OFF)
            self.counts.node_s += now - self.on_since.pop(name)
            self.counts.up_spans.setdefault(name, []).append((self.up_since.pop(name), now))
            self.counts.suspends += 1

    def _set_state(self, name: str, state: str) -> None:
        was, self.state[name] = self.state[name], state
        if (was == UP) != (state == UP):
            self._room(name, up=state == UP)
        self.dirty.add(name)
        self.stirred = True

    def _room(self, name: str, up: bool) -> None:
        """A node that is not UP counts as one with no GPU free (`_futile`'s count)."""
        free = len(self.free[name])
        self.room[0 if up else free] -= 1
        self.room[free if up else 0] += 1

    # ------------------------------------------------------------ the engine's hooks

    def _node_views(self) -> tuple[NodeView, ...]:
        fresh = set(self.dirty)
        views = super()._node_views()
        if not fresh:
            return views
        for name in fresh:
            if self.state[name] != UP:
                self.views[name] = replace(self.views[name], schedulable=False)
        self.node_tuple = tuple(self.views[n] for n in self.free)
        return self.node_tuple

    def _start(self, start: Start, now: float) -> None:
        off = [n for n in start.alloc if self.state[n] != UP]
        if off:
            raise SimInvariantError(f"job {start.job_id} started on {off}, which are "
                                    f"{[self.state[n] for n in off]}")
        super()._start(start, now)


def always_on_node_s(result: SimResult) -> float:
    """Node-seconds of the always-on baseline: every node from the first submit to the last
    end."""
    first = min((o.job.submit_time for o in result.outcomes), default=0.0)
    last = max((o.end for o in result.outcomes if o.end is not None), default=first)
    return result.cluster.nodes * (last - first)


def spike(jobs: list[TraceJob], factor: float, start: float | None = None,
          length: float | None = None, seed: int = 0) -> list[TraceJob]:
    """The trace with `factor` times its arrivals in the window [start, start + length) (seconds
    from its first submit; default: from 40% of its span, a tenth of it): each job submitted
    in the window gets factor - 1 copies (whole copies, then one more with the fraction's
    chance), submitted at random in the window."""
    if factor <= 1 or not jobs:
        return list(jobs)
    first = min(j.submit_time for j in jobs)
    span = max(j.submit_time for j in jobs) - first
    begin = first + (0.4 * span if start is None else start)
    width = 0.1 * span if length is None else length
    rng = random.Random(seed)
    out, next_id = list(jobs), max(j.id for j in jobs) + 1
    for job in jobs:
        if not begin <= job.submit_time < begin + width:
            continue
        extra = int(factor - 1) + (rng.random() < (factor - 1) % 1)
        for k in range(extra):
            out.append(replace(job, id=next_id, name=f"{job.name}+{k + 1}",
                               submit_time=round(begin + rng.random() * width, 3)))
            next_id += 1
    return sorted(out, key=lambda j: (j.submit_time, j.id))
