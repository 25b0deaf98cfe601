"""Job arrays: `--array` specs, task references (`123_7`), and squeue's folded form (`123_[8-99%10]`).

Pure. A task is a job of its own; `array_job_id` (the first task's id, as in Slurm) ties them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gq.defaults import MAX_ARRAY_INDEX, MAX_ARRAY_TASKS
from gq.errors import UsageError

_FORMS = "N, N-M, N-M:STEP, or a comma list of those, then optionally %LIMIT: 0-99, 1,3,7, 0-99:2, 0-99%10"
_PART_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_REF_RE = re.compile(r"^(\d+)(?:_(\d+))?$")


class ArraySpec:
    """A parsed `--array`: its task indices, ascending, and the most tasks running at once
    (`%N`), or None for no limit. A plain class, not a dataclass: `gq show` imports this
    module (parse_ref), and `dataclasses` (with `inspect`) costs it more than the rest."""

    __slots__ = ("indices", "throttle")

    def __init__(self, indices: tuple[int, ...], throttle: int | None = None) -> None:
        self.indices = indices
        self.throttle = throttle

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArraySpec):
            return NotImplemented
        return (self.indices, self.throttle) == (other.indices, other.throttle)

    def __hash__(self) -> int:
        return hash((self.indices, self.throttle))

    def __repr__(self) -> str:
        return f"ArraySpec(indices={self.indices!r}, throttle={self.throttle!r})"


def parse_array(text: str) -> ArraySpec:
    raw = str(text).strip()
    body, _, limit = raw.partition("%")
    if limit and not limit.isdigit() or limit == "0":
        raise UsageError(f"bad --array {text!r}: the %LIMIT must be a positive number; "
                         f"expected {_FORMS}")
    indices: set[int] = set()
    for part in body.split(","):
        # Slurm takes the brackets of a hostlist-like `[0-4]` (or `[1,3]`) and drops them.
        m = _PART_RE.match(part.strip().removeprefix("[").removesuffix("]"))
        if not m:
            raise UsageError(f"bad --array {text!r}: {part!r} is not a range; expected {_FORMS}")
        first, last, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
        if last < first or step < 1 or last > MAX_ARRAY_INDEX:
            raise UsageError(f"bad --array {text!r}: {part!r} must go upwards, in steps of at "
                             f"least 1, up to {MAX_ARRAY_INDEX}")
        indices.update(range(first, last + 1, step))
        if len(indices) > MAX_ARRAY_TASKS:
            raise UsageError(f"bad --array {text!r}: at most {MAX_ARRAY_TASKS} tasks")
    return ArraySpec(indices=tuple(sorted(indices)), throttle=int(limit) if limit else None)


def parse_ref(text: str) -> int | str:
    """A job as users name it: `123` (an int) or `123_7` (task 7 of array 123, kept a string)."""
    m = _REF_RE.match(str(text).strip())
    if not m or int(m[1]) <= 0:
        raise UsageError(f"bad job id {text!r}: expected a number, or ARRAYID_INDEX as 123_7")
    return int(m[1]) if m[2] is None else f"{int(m[1])}_{int(m[2])}"


def split_ref(ref: str) -> tuple[int, int]:
    """(array job id, index) of a `123_7` reference."""
    m = _REF_RE.match(ref)
    if not m or m[2] is None:
        raise UsageError(f"bad job id {ref!r}: expected a number, or ARRAYID_INDEX as 123_7")
    return int(m[1]), int(m[2])


def fold(indices: Iterable[int]) -> str:
    """`0-3,7,9-11` from the indices (any order)."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
