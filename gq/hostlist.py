"""Slurm's hostlist form of node names: `node[1-4,7],gpu[01-02]` <-> node1 node2 ... gpu02.

`expand` reads what sbatch's -w/-x, `scontrol show hostnames` and `[partition] nodes` take;
`compress` writes what SLURM_JOB_NODELIST, squeue and sinfo show (Slurm's own layout: names
in the order given, runs of one prefix folded, zero padding kept). Pure: no imports from gq but
its errors.
"""

from __future__ import annotations

import re

from gq.errors import UsageError

TYPE_CHECKING = False  # typing is not imported for the Slurm commands' usual calls
if TYPE_CHECKING:
    from typing import Any

#: Most names one hostlist may stand for (a typo like n[1-999999999] must not eat memory).
MAX_NAMES = 100_000
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def expand(text: str) -> list[str]:
    """The names of a hostlist (`n[1-3,5],x7` -> n1 n2 n3 n5 x7), in order, without repeats;
    UsageError for a malformed one."""
    names: list[str] = []
    for item in _items(text.strip()):
        names.extend(_expand_item(item, text))
        if len(names) > MAX_NAMES:
            raise UsageError(f"bad hostlist {text!r}: more than {MAX_NAMES} names")
    return list(dict.fromkeys(names))


def _items(text: str) -> list[str]:
    """The comma-separated items of a hostlist, commas inside brackets kept."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [i.strip() for i in items if i.strip()]


def _expand_item(item: str, text: str) -> list[str]:
    """One item: a plain name, or prefix[ranges]suffix (brackets may repeat: a[1-2]b[3-4])."""
    open_at = item.find("[")
    if open_at < 0:
        if "]" in item or " " in item:
            raise UsageError(f"bad hostlist {text!r}: unbalanced brackets in {item!r}")
        return [item]
    close_at = item.find("]", open_at)
    if close_at < 0 or close_at == open_at + 1:
        raise UsageError(f"bad hostlist {text!r}: unbalanced brackets in {item!r}")
    prefix, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    tails = _expand_item(rest, text) if rest else [""]
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise UsageError(f"bad hostlist {text!r}: {part!r} is not a number or a range")
        low, high = m[1], m[2] or m[1]
        if int(high) < int(low):
            raise UsageError(f"bad hostlist {text!r}: range {part!r} goes down")
        if int(high) - int(low) > MAX_NAMES:
            raise UsageError(f"bad hostlist {text!r}: more than {MAX_NAMES} names")
        width = len(low) if low.startswith("0") else 0
        out.extend(f"{prefix}{n:0{width}d}{tail}" for n in range(int(low), int(high) + 1)
                   for tail in tails)
    return out


def natural_key(name: str) -> tuple[Any, ...]:
    """Sorts node names as Slurm orders a job's nodes: node2 before node10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def compress(names: list[str]) -> str:
    """The hostlist of `names` as Slurm writes it: consecutive names of one prefix (and number
    width) folded into ranges, e.g. n1 n2 n3 n5 -> n[1-3,5]; the order of first appearance of
    each prefix kept."""
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    key: tuple[str, int] | str
    for name in dict.fromkeys(names):
        m = _NUMBERED.match(name)
        if not m:
            order.append(name)
            continue
        digits = m[2]
        key = (m[1], len(digits) if digits.startswith("0") and len(digits) > 1 else 0)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    out = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        prefix, width = key
        numbers = sorted(set(groups[key]))
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        out.append(f"{prefix}[{','.join(_runs(numbers, width))}]")
    return ",".join(out)


def _runs(numbers: list[int], width: int) -> list[str]:
    """`1 2 3 5` -> `1-3`, `5`."""
    runs = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(f"{start:0{width}d}" if start == prev
                    else f"{start:0{width}d}-{prev:0{width}d}")
        if n is not None:
            start = prev = n
    return runs


def counted(values: list[int]) -> str:
    """Slurm's run-length form of per-node counts: 16 16 -> `16(x2)`; 4 2 -> `4,2`
    (SLURM_JOB_CPUS_PER_NODE, SLURM_TASKS_PER_NODE)."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        out.append(str(values[i]) if j == i else f"{values[i]}(x{j - i + 1})")
        i = j + 1
    return ",".join(out)
