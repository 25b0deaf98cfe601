"""What gqd tells its nodes, as values: made by the job table and the node registry, encoded and
sent by the daemon only once the turn that made them has committed (a rolled-back turn's orders
are dropped with it, so no node acts on a change the store does not hold)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gq import protocol
from gq.messages import HeadMessage, Kill
from gq.model import Job


@dataclass(frozen=True, slots=True)
class Order:
    """A message (gq.messages: Launch, Kill, Ack, Reregister, Step, StepKill) for node `node`."""

    node: str
    msg: HeadMessage

    def encode(self) -> bytes:
        return protocol.encode_message(self.msg)


def kills(nodes: Iterable[str], job: Job, signal: str, **extra: Any) -> list[Order]:
    """A Kill of the job's current run for each of `nodes` (`extra`: Kill's other fields)."""
    return [Order(node, Kill(job.id, job.restart_count, signal, **extra)) for node in nodes]
