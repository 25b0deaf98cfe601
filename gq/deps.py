"""Job dependencies (`--dependency`): parsing, and whether one is met, still open or never met.

Pure: the head passes in what it knows about the parent jobs.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass

from gq.errors import UsageError

#: Conditions on other jobs, as sbatch names them.
KINDS = ("after", "afterany", "afterok", "afternotok")
SINGLETON = "singleton"
_FORMS = ("TYPE:ID[:ID...] joined by ',' (all must hold) or '?' (any may), TYPE one of "
          f"{', '.join(KINDS)}; or {SINGLETON}; e.g. afterok:12:13,afterany:14")
_COND_RE = re.compile(r"^([a-z]+)((?::\d+)+)$")


class Verdict(str, enum.Enum):
    #: Every condition holds: the job may be scheduled.
    MET = "met"
    #: Still waiting on a parent (reason `Dependency`).
    WAITING = "waiting"
    #: Cannot hold any more (reason `DependencyNeverSatisfied`).
    NEVER = "never"


@dataclass(frozen=True)
class Dependency:
    #: (kind, parent ids) per condition; singleton is (SINGLETON, ()).
    conditions: tuple[tuple[str, tuple[int, ...]], ...]
    #: Joined with '?': one met condition is enough.
    any_of: bool = False

    @property
    def parents(self) -> set[int]:
        return {i for _, ids in self.conditions for i in ids}

    def __str__(self) -> str:
        """The canonical form, which the spec stores: `afterok:1:2,singleton`."""
        parts = [kind + "".join(f":{i}" for i in ids) for kind, ids in self.conditions]
        return ("?" if self.any_of else ",").join(parts)


def parse_dependency(text: str) -> Dependency:
    raw = str(text).strip().lower()
    if "," in raw and "?" in raw:
        raise UsageError(f"bad --dependency {text!r}: use ',' or '?' between conditions, "
                         "not both")
    any_of = "?" in raw
    conditions: list[tuple[str, tuple[int, ...]]] = []
    for part in raw.split("?" if any_of else ","):
        if part == SINGLETON:
            conditions.append((SINGLETON, ()))
            continue
        m = _COND_RE.match(part)
        if not m or m[1] not in KINDS:
            raise UsageError(f"bad --dependency {text!r}: {part!r} is not a condition; "
                             f"expected {_FORMS}")
        conditions.append((m[1], tuple(int(i) for i in m[2][1:].split(":"))))
    return Dependency(conditions=tuple(conditions), any_of=any_of)


@dataclass(frozen=True)
class ParentState:
    """What a condition needs to know of a parent job."""

    #: The JobState value (`COMPLETED`, `RUNNING` ...).
    state: str
    started: bool

    @property
    def ended(self) -> bool:
        return self.state not in ("PENDING", "RUNNING")


def _condition(kind: str, parent: ParentState) -> Verdict:
    if kind == "after":
        return Verdict.MET if parent.started or parent.ended else Verdict.WAITING
    if not parent.ended:
        return Verdict.WAITING
    if kind == "afterany":
        return Verdict.MET
    ok = parent.state == "COMPLETED"
    return Verdict.MET if ok == (kind == "afterok") else Verdict.NEVER


def evaluate(dep: Dependency, parent: Callable[[int], ParentState],
             singleton_clear: bool) -> Verdict:
    """The dependency's verdict; `singleton_clear`: no earlier job of the same name and user
    is still pending or running."""
    verdicts = []
    for kind, ids in dep.conditions:
        if kind == SINGLETON:
            verdicts.append(Verdict.MET if singleton_clear else Verdict.WAITING)
            continue
        each = [_condition(kind, parent(i)) for i in ids]
        verdicts.append(Verdict.NEVER if Verdict.NEVER in each else
                        Verdict.WAITING if Verdict.WAITING in each else Verdict.MET)
    if dep.any_of:
        return Verdict.MET if Verdict.MET in verdicts else (
            Verdict.NEVER if all(v == Verdict.NEVER for v in verdicts) else Verdict.WAITING)
    return Verdict.NEVER if Verdict.NEVER in verdicts else (
        Verdict.WAITING if Verdict.WAITING in verdicts else Verdict.MET)
