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
from gq import protocol
from gq.jsontext import json_str, pretty
from gq.model import JOB_FIELDS, Job, job_record

#: The fields a record may read, but the priority: equal values, equal record.
_WATCHED = operator.attrgetter(*(f.name for f in dataclasses.fields(Job) if f.name != "priority"))
#: The job attribute holding its kept records: (the watched values they were made from,
#: field set -> (bytes before the priority's value, bytes after it; or all and None)).
_ATTR = "_listed"
#: And its `--json` text in two parts either side of the priority's (`texts`; none yet: []).
_Kept = tuple[tuple[object, ...], dict[tuple[str, ...] | None, tuple[bytes, bytes | None]],
              list[tuple[bytes, bytes]]]
#: The depth of a job in the `--json` listing document: {"jobs": [{...}]}.
_PAD, _INNER = "    ", "      "

def _header_len(n: int) -> int:
    """Bytes of msgpack's header of a map of n items (fixmap, map16, map32)."""
    return 1 if n < 16 else 3 if n < 1 << 16 else 5


def packed(key: tuple[str, ...] | None) -> Callable[[Job], bytes]:
    """A function giving a job's record of field set `key` (job_record's: None for all of
    them) packed as pack(job_record(key)(job)) would be, made again only when the job has
    changed since it was last made. Its parts either side of the priority are made by records
    of those fields alone (job_record's too), so a record made anew costs no more than one
    made for a single listing."""
    pack = protocol.packer()
    names = tuple(JOB_FIELDS) if key is None else key
    at = names.index("priority") if "priority" in names else len(names)
    head = protocol.map_header(len(names))
    before, after = job_record(names[:at]), job_record(names[at + 1:])
    cut_before, cut_after = _header_len(at), _header_len(max(0, len(names) - at - 1))
    tail = at < len(names)

    def packed_record(job: Job) -> bytes:
        seen = _WATCHED(job)
        kept: _Kept | None = job.__dict__.get(_ATTR)
        if kept is None or kept[0] != seen:  # changed: every field set's record goes
            kept = job.__dict__[_ATTR] = (seen, {}, [])
        entry = kept[1].get(key)
        if entry is None:
            entry = kept[1][key] = (head + pack(before(job))[cut_before:]
                                    + (pack("priority") if tail else b""),
                                    pack(after(job))[cut_after:] if tail else None)
        if entry[1] is None:
            return entry[0]
        return entry[0] + pack(job.priority) + entry[1]
    return packed_record


def texts() -> Callable[[Job], bytes]:
    """A function giving a job's full `--json` record as the listing document writes it
    (json.dumps(document, indent=2): at a job's depth there, its first line's indent too),
    packed as msgpack bin (the text is ASCII: strings are written with json's \\u escapes),
    made again only when the job has changed, as `packed`'s records are. So a client writing
    `gq queue --json` joins kept texts (render.emit_jobs_json) instead of decoding 49 values a
    job and writing their JSON (1.8 s of its 2.4 s with 100,000 jobs), and gqd sends them with
    a header and the priority's digits spliced in, not packed again (docs/BENCHMARKS.md)."""
    record = job_record()
    names = tuple(JOB_FIELDS)
    at = names.index("priority")
    heads = [f"{_INNER}{json_str(name)}: " for name in names]
    join = b"".join

    def text(job: Job) -> bytes:
        seen = _WATCHED(job)
        kept: _Kept | None = job.__dict__.get(_ATTR)
        if kept is None or kept[0] != seen:
            kept = job.__dict__[_ATTR] = (seen, {}, [])
        if not kept[2]:
            lines = [head + pretty(value, _INNER)
                     for head, value in zip(heads, record(job).values())]
            kept[2].append((
                (_PAD + "{\n" + "".join(line + ",\n" for line in lines[:at])
                 + heads[at]).encode("ascii"),
                ("".join(",\n" + line for line in lines[at + 1:])
                 + f"\n{_PAD}}}").encode("ascii")))
        before, after = kept[2][0]
        priority = job.priority
        digits = (int.__repr__(priority) if type(priority) is int
                  else pretty(priority)).encode("ascii")
        return join((_bin_header(len(before) + len(digits) + len(after)), before, digits, after))
    return text


def _bin_header(n: int) -> bytes:
    """msgpack's header of a bin of n bytes (bin8, bin16, bin32)."""
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")
