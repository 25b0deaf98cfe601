"""Slurm's output formats: squeue's and sinfo's `%[.][size]X` (`%.18i %.9P %8j`; `.` right
justifies; a size pads and cuts, as Slurm does; `#` sizes a field to its widest value) and
sacct's `Field[%size]` lists."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from gq.slurm.common import Failure

TYPE_CHECKING = False  # typing is not imported for the Slurm commands' usual calls
if TYPE_CHECKING:
    from typing import Any

_SPEC = re.compile(r"%(\.)?(#|\d+)?([A-Za-z])")

if TYPE_CHECKING:
    #: A field's header and how to get its text from a row.
    Column = tuple[str, Callable[[Any], str]]


def parse(fmt: str, columns: dict[str, Column], prog: str) -> list[tuple[Any, ...]]:
    """The pieces of a `%` format: literal text as ("", text), fields as (letter, right,
    size) with size an int, "#" or None. An unknown letter is Slurm's error."""
    pieces: list[tuple[Any, ...]] = []
    at = 0
    for m in _SPEC.finditer(fmt):
        if "%" in fmt[at:m.start()]:
            break  # a % that starts no field before this one
        if m.start() > at:
            pieces.append(("", fmt[at:m.start()]))
        if m[3] not in columns:
            raise Failure(f"{prog}: error: Invalid job format specification: {m[3]}")
        size = m[2] if m[2] == "#" else int(m[2]) if m[2] else None
        pieces.append((m[3], bool(m[1]), size))
        at = m.end()
    if "%" in fmt[at:]:
        bad = fmt[fmt.index("%", at) + 1:][:1] or "%"
        raise Failure(f"{prog}: error: Invalid job format specification: {bad}")
    if at < len(fmt):
        pieces.append(("", fmt[at:]))
    return pieces


def render(pieces: list[tuple[Any, ...]], columns: dict[str, Column], rows: Sequence[Any],
           header: bool) -> list[str]:
    """The lines of a listing: the header (if asked for), then one a row."""
    cells = [[columns[p[0]][1](row) if p[0] else "" for p in pieces] for row in rows]
    heads = [columns[p[0]][0] if p[0] else "" for p in pieces]
    sizes: list[int | None] = []
    for i, piece in enumerate(pieces):
        size = piece[2] if piece[0] else None
        if size == "#":
            size = max([len(heads[i]), *(len(c[i]) for c in cells)])
        sizes.append(size)

    def line(values: list[str]) -> str:
        out = []
        for piece, value, size in zip(pieces, values, sizes):
            if not piece[0]:
                out.append(piece[1])
            elif size is None:
                out.append(value)
            else:
                value = value[:size]
                out.append(value.rjust(size) if piece[1] else value.ljust(size))
        return "".join(out)
    return ([line(heads)] if header else []) + [line(c) for c in cells]


def fields(fmt: str, known: dict[str, Column], prog: str) -> list[tuple[str, int | None]]:
    """sacct's `--format=JobID,JobName%30,...`: (field, size) each; names any case."""
    by_lower = {name.lower(): name for name in known}
    out = []
    for item in (i.strip() for i in fmt.split(",")):
        if not item:
            continue
        name, _, size = item.partition("%")
        field = by_lower.get(name.lower())
        if field is None:
            raise Failure(f"{prog}: error: Invalid field requested: \"{name}\"")
        out.append((field, int(size) if size.isdigit() else None))
    return out
