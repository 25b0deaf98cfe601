"""The pure scheduler: `plan(state, now, policy) -> Plan`. No clock, no SQL, no sockets."""

from gq.sched.plan import plan
from gq.sched.types import (NodeView, PendingJob, Plan, Policy, Preempt, Reservation, RunningJob,
                            Snapshot, Start)

__all__ = ["plan", "NodeView", "PendingJob", "Plan", "Policy", "Preempt", "Reservation",
           "RunningJob", "Snapshot", "Start"]
