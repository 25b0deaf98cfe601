"""Node features (`[node] features`) and the jobs' `--constraint` on them, as Slurm's minimum:
`a&b` (or `a,b`) all of them, `a|b` any of them, `[a|b]` the same; counts (`a*2`) are not
understood. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from gq.errors import UsageError

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-+:=/")


def parse_constraint(text: str) -> tuple[frozenset[str], ...]:
    """The alternatives of a constraint, each the set of features a node must all have."""
    raw = text.strip().replace("[", "").replace("]", "").replace('"', "")
    alternatives = []
    for alternative in raw.split("|"):
        names = frozenset(n.strip() for n in alternative.replace(",", "&").split("&"))
        if not names or not all(n and set(n) <= _NAME_CHARS for n in names):
            raise UsageError(f"bad --constraint {text!r}: expected feature names joined by & "
                             "(all of them) or | (any of them), e.g. gpu80&nvlink or a100|h100")
        alternatives.append(names)
    return tuple(alternatives)


def satisfies(features: Iterable[str], constraint: tuple[frozenset[str], ...]) -> bool:
    """A node with `features` meets the constraint."""
    have = frozenset(features)
    return any(names <= have for names in constraint)
