"""What a node's GPU telemetry means for placement: which GPUs it rules out, and why, in words.

A node sends each GPU's VRAM in use and temperature every heartbeat (`Node.telemetry`,
`Node.telemetry_at`). While that is fresh (younger than `[head] telemetry_stale_s`):

- a GPU hotter than `[node] max_gpu_temp_c` gets no new jobs;
- on a GPU no gq job holds, what is in use is held by processes that are not gq's, so a job is
  offered the GPU only if total minus that covers its --gpu-mem. (On a GPU a job holds, the
  readings cannot be told apart from the job's own: sharing jobs are placed by their --gpu-mem
  bookings, as before.)

Stale telemetry counts as unknown: the node's GPUs are placed by their type and VRAM alone, as
without telemetry, and `gq nodes` marks them stale. The rules go to the pure scheduler as the
NodeView's `vram_free` and `hot` (gq/sched/placement.py applies them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gq.config import Config
from gq.model import Node
from gq.units import format_size

#: What `gq nodes` shows of a GPU whose node's telemetry is stale.
STALE = "telemetry stale"


@dataclass(frozen=True)
class Rule:
    max_temp_c: float
    stale_s: float

    @classmethod
    def of(cls, cfg: Config) -> Rule:
        return cls(max_temp_c=cfg.node.max_gpu_temp_c, stale_s=cfg.head.telemetry_stale_s)

    def fresh(self, node: Node, now: float) -> bool:
        return bool(node.telemetry) and now - node.telemetry_at <= self.stale_s

    def stale_at(self, node: Node) -> float:
        """When the node's telemetry goes stale (what it rules out then no longer counts)."""
        return node.telemetry_at + self.stale_s + 0.001

    def limits(self, node: Node, now: float, held: set[int] | frozenset[int]
               ) -> tuple[dict[int, int], frozenset[int]]:
        """(GPU index -> VRAM free of processes not gq's, for the free GPUs with some in use;
        the GPUs too hot for new jobs), from fresh telemetry; nothing from stale."""
        if not self.fresh(node, now):
            return {}, frozenset()
        room: dict[int, int] = {}
        hot = set()
        for gpu in node.gpus:
            reading = node.telemetry.get(gpu.index) or {}
            temp, used = _num(reading.get("temp")), _num(reading.get("mem_used"))
            if temp is not None and temp > self.max_temp_c:
                hot.add(gpu.index)
            if used and gpu.index not in held:
                room[gpu.index] = max(0, gpu.memory - int(used))
        return room, frozenset(hot)

    def notes(self, node: Node, now: float, held: set[int] | frozenset[int]) -> dict[int, str]:
        """GPU index -> what `gq nodes` says of it: why new jobs skip it, or that its
        telemetry is stale (then nothing is skipped)."""
        if node.telemetry and not self.fresh(node, now):
            return {g.index: STALE for g in node.gpus}
        room, hot = self.limits(node, now, held)
        out = {}
        for gpu in node.gpus:
            said = []
            if gpu.index in hot:
                temp = _num((node.telemetry.get(gpu.index) or {}).get("temp"))
                said.append(f"too hot: {temp:g}C over {self.max_temp_c:g}C, no new jobs")
            if gpu.index in room:
                said.append(f"{format_size(gpu.memory - room[gpu.index])} used outside gq, "
                            f"{format_size(room[gpu.index]) if room[gpu.index] else 'none'} free")
            if said:
                out[gpu.index] = "; ".join(said)
        return out


#: VRAM freed on a GPU that counts as news (smaller changes are the noise of real readings).
EASED_VRAM = 1024**3


def eased(before: tuple[dict[int, int], frozenset[int]],
          after: tuple[dict[int, int], frozenset[int]]) -> bool:
    """Whether new readings rule out less than `before` did (`Rule.limits`, each): a GPU
    cooled, or a GiB of VRAM or more came free, so a pass may now place what it could not."""
    (room_before, hot_before), (room_after, hot_after) = before, after
    return bool(hot_before - hot_after) or any(
        room_after.get(gpu, math.inf) - free >= EASED_VRAM for gpu, free in room_before.items())


def _num(value: Any) -> float | None:
    """A reading a node sent, if it is a finite number (nodes are trusted little)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
