"""Listing records kept between listings: a job's packed record (one per field set a client
asks for) is made once and sent again until the job changes.

Making a record (JOB_FIELDS' values, two output paths expanded, four times formatted) and
packing it was most of gqd's time answering `gq queue --json` with 100,000 jobs, and a queued
job's record changes only when the job does. Whether it did is read off the job itself, not
told by each transition: the record is kept with the values of all the job's fields but its
priority (`_WATCHED`, one C call), and made again when any differs. So no change, nor the
journal's undo (which writes back a job's whole __dict__, this one included), can leave a
stale record, and a field added to Job is watched with no edit here. A field is replaced on
a change, never changed in place (the allocation, a new dict in JobTable.start; the spec,
frozen), so the kept values are those the record was made from.

The priority moves with the clock (worked out when shown): it is packed alone, between the
kept bytes before and after it.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

from gq import protocol
from gq.model import Job

#: The fields a record may read, but the priority: equal values, equal record.
_WATCHED = operator.attrgetter(*(f.name for f in dataclasses.fields(Job) if f.name != "priority"))
#: The job attribute holding its kept records: field set -> (watched values, bytes before the
#: priority's value, bytes after it; or the whole record and None).
_ATTR = "_listed"

Record = Callable[[Job], dict[str, Any]]


def _header_len(n: int) -> int:
    """Bytes of msgpack's header of a map of n items (fixmap, map16, map32)."""
    return 1 if n < 16 else 3 if n < 1 << 16 else 5


def _split(data: dict[str, Any], pack: Callable[[Any], bytes]) -> tuple[bytes, bytes | None]:
    """`data` packed (as pack(data) writes it) in two parts, either side of the priority's
    value; or all of it and None when it has no priority."""
    if "priority" not in data:
        return pack(data), None
    items = list(data.items())
    at = list(data).index("priority")
    before, after = dict(items[:at]), dict(items[at + 1:])
    head = protocol.map_header(len(data))
    return (head + pack(before)[_header_len(len(before)):] + pack("priority"),
            pack(after)[_header_len(len(after)):])


def packed(key: tuple[str, ...] | None, record: Record) -> Callable[[Job], bytes]:
    """A function giving a job's record of field set `key` (made by `record`) packed, made
    again only when the job has changed since it was last made."""
    pack = protocol.packer()

    def packed_record(job: Job) -> bytes:
        seen = _WATCHED(job)
        kept = job.__dict__.get(_ATTR)
        entry = kept.get(key) if kept is not None else None
        if entry is None or entry[0] != seen:
            before, after = _split(record(job), pack)
            if kept is None:
                kept = job.__dict__[_ATTR] = {}
            kept[key] = entry = (seen, before, after)
        if entry[2] is None:
            return entry[1]
        return entry[1] + pack(job.priority) + entry[2]
    return packed_record
