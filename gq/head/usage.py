"""Decayed GPU-seconds per user, the input of fair share."""

from __future__ import annotations

from gq.model import Job


class Usage:
    """Each user's GPU-seconds, halved every `half_life_s`; kept as (value, as of when)."""

    def __init__(self, half_life_s: float):
        self.half_life_s = half_life_s
        self._by_user: dict[str, tuple[float, float]] = {}

    def charge(self, job: Job, end: float) -> None:
        if not job.start_time:
            return
        gpu_seconds = job.spec.gpus * job.spec.nodes * max(0.0, end - job.start_time)
        value, at = self._by_user.get(job.spec.user, (0.0, end))
        if end >= at:
            self._by_user[job.spec.user] = (self._decay(value, end - at) + gpu_seconds, end)
        else:  # charges may come out of order (history loaded at start): decay the older one
            self._by_user[job.spec.user] = (value + self._decay(gpu_seconds, at - end), at)

    def entry(self, user: str) -> tuple[float, float] | None:
        """What is kept for `user` (for `restore`)."""
        return self._by_user.get(user)

    def restore(self, user: str, entry: tuple[float, float] | None) -> None:
        """Put back what `entry` gave (a charge was rolled back)."""
        if entry is None:
            self._by_user.pop(user, None)
        else:
            self._by_user[user] = entry

    def at(self, now: float) -> dict[str, float]:
        return {user: self._decay(value, now - at) for user, (value, at) in self._by_user.items()}

    def _decay(self, value: float, elapsed: float) -> float:
        if self.half_life_s <= 0:
            return value
        return value * 0.5 ** (max(0.0, elapsed) / self.half_life_s)
