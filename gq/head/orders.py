"""What gqd tells its nodes, as values: made by the job table and the node registry, encoded and
sent by the daemon only once the turn that made them has committed (a rolled-back turn's orders
are dropped with it, so no node acts on a change the store does not hold)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

from gq import protocol, stepwire
from gq.model import Job


@dataclass(frozen=True, slots=True)
class LaunchOrder:
    """Start one rank of a job's run on `node`."""

    node: str
    job_id: int
    restart: int
    spec: dict[str, Any]
    gpus: list[int]
    rank: int
    nodelist: list[str]
    time_limit_s: int
    stdout: str
    stderr: str
    #: The job's record as `gq show --json` has it when the launch was made.
    job: dict[str, Any]
    grace_s: float
    checkpoint_dir: str
    master_addr: str
    #: The cluster's name (SLURM_CLUSTER_NAME).
    cluster: str = ""

    def encode(self) -> bytes:
        return protocol.encode(
            protocol.LAUNCH, job_id=self.job_id, restart=self.restart, spec=self.spec,
            gpus=self.gpus, rank=self.rank, nodelist=self.nodelist,
            time_limit_s=self.time_limit_s, stdout=self.stdout, stderr=self.stderr, job=self.job,
            grace_s=self.grace_s, checkpoint_dir=self.checkpoint_dir,
            master_addr=self.master_addr, cluster=self.cluster)


@dataclass(frozen=True, slots=True)
class KillOrder:
    """Stop (or only signal, `no_kill`) run `restart` of a job on `node`; None: not sent."""

    node: str
    job_id: int
    restart: int
    signal: str
    batch_only: bool | None = None
    grace_s: float | None = None
    no_kill: bool | None = None

    def encode(self) -> bytes:
        extra = {k: v for k, v in (("batch_only", self.batch_only), ("grace_s", self.grace_s),
                                   ("no_kill", self.no_kill)) if v is not None}
        return protocol.encode(protocol.KILL, job_id=self.job_id, restart=self.restart,
                               signal=self.signal, **extra)


@dataclass(frozen=True, slots=True)
class AckOrder:
    """The head holds report `seq` of `node`: it may forget it."""

    node: str
    seq: int

    def encode(self) -> bytes:
        return protocol.encode(protocol.ACK, seq=self.seq)


@dataclass(frozen=True, slots=True)
class ReregisterOrder:
    """The head does not know `node`'s connection (it restarted, or rolled a registration
    back): the node registers again."""

    node: str

    def encode(self) -> bytes:
        return protocol.encode(protocol.REREGISTER)


@dataclass(frozen=True, slots=True)
class StepOrder:
    """Start `node`'s tasks of a job step (gq/head/steps.py); `fields`: STEP's."""

    node: str
    fields: dict[str, Any]

    def encode(self) -> bytes:
        return protocol.encode(stepwire.STEP, **self.fields)


@dataclass(frozen=True, slots=True)
class StepKillOrder:
    """End `node`'s tasks of step `step` of run `restart` of a job."""

    node: str
    job_id: int
    restart: int
    step: int
    signal: str = "TERM"

    def encode(self) -> bytes:
        return protocol.encode(stepwire.STEP_KILL, job_id=self.job_id, restart=self.restart,
                               step=self.step, signal=self.signal)


Order = Union[LaunchOrder, KillOrder, AckOrder, ReregisterOrder, StepOrder, StepKillOrder]


def kills(nodes: Iterable[str], job: Job, signal: str, **extra: Any) -> list[Order]:
    """A KillOrder of the job's current run for each of `nodes`."""
    return [KillOrder(node, job.id, job.restart_count, signal, **extra) for node in nodes]
