"""gqd's kept listing records (gq/head/records.py): the bytes a fresh record packs to, for a
job in any state and after any change, made again only when the job changed."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from gq.cli import render
from gq.head import records
from gq.model import Job, JobSpec, JobState, job_record


def _fresh(job: Job, key: tuple[str, ...] | None) -> bytes:
    return msgpack.packb(job_record(key)(job), use_bin_type=True)


def _changes(job: Job) -> list[tuple[str, Any]]:
    """A new value for every field a record may show (the priority aside)."""
    return [("state", JobState.RUNNING), ("reason", "Resources"), ("start_time", 1.7e9 + 5),
            ("alloc", {"n2": [3], "n1": [0, 1]}), ("end_time", 1.7e9 + 9), ("exit_code", 3),
            ("hold", "user"), ("restart_count", 2), ("node_fail_count", 1),
            ("checkpoint_time", 1.7e9 + 7), ("submit_time", 1.7e9 - 1),
            ("array_job_id", 40), ("array_index", 7),
            ("spec", dataclasses.replace(job.spec, name="renamed", output="o-%j-%N.txt",
                                         time_limit_s=99, qos="high"))]


def test_a_kept_record_is_the_fresh_one_after_every_change() -> None:
    for key in (None, render.QUEUE_FIELDS, ("id", "priority"), ("priority",), ("name",),
                ("priority", "id"), ()):
        packed = records.packed(key)
        job = Job(id=12, spec=JobSpec(script="x", name="j", cwd="/w", output="%x-%j.out"),
                  submit_time=1.7e9)
        assert packed(job) == _fresh(job, key)
        for name, value in _changes(job):
            was = dict(job.__dict__)  # as JobTable._keep journals it
            setattr(job, name, value)
            assert packed(job) == _fresh(job, key), name
            assert packed(job) == _fresh(job, key), name  # kept: the same bytes again
            job.__dict__.update(was)  # the journal's undo: the record before the change
            assert packed(job) == _fresh(job, key), f"undo of {name}"
            setattr(job, name, value)
        packed(job)
        kept = job.__dict__["_listed"][1][key]
        for priority in (5, 70_000, -3, 2**40):  # moves with the clock: spliced, not remade
            job.priority = priority
            assert packed(job) == _fresh(job, key)
            assert job.__dict__["_listed"][1][key] is kept


def test_each_field_set_is_kept_apart_on_the_job() -> None:
    job = Job(id=3, spec=JobSpec(script="x", name="j", cwd="/w"), submit_time=1.7e9)
    full, table = records.packed(None), records.packed(render.QUEUE_FIELDS)
    for _ in range(2):
        assert full(job) == _fresh(job, None)
        assert table(job) == _fresh(job, render.QUEUE_FIELDS)
    assert set(job.__dict__["_listed"][1]) == {None, render.QUEUE_FIELDS}
    job.reason = "Resources"  # a change lets go of every field set's record at once
    assert table(job) == _fresh(job, render.QUEUE_FIELDS)
    assert set(job.__dict__["_listed"][1]) == {render.QUEUE_FIELDS}
    # A field added to Job is watched with no edit to records.py: all but the priority are.
    watched = records._WATCHED(job)
    assert len(watched) == len(dataclasses.fields(Job)) - 1


def _document(texts: list[bytes], capsys: Any) -> str:
    render.emit_jobs_json([msgpack.unpackb(t) for t in texts])  # as the client has them
    return str(capsys.readouterr().out)


def test_a_kept_json_text_is_what_json_dumps_writes_after_every_change(capsys: Any) -> None:
    """`gq queue --json` joins gqd's kept texts: the document is json.dumps(indent=2)'s, byte
    for byte, for jobs in any state, after any change, an undo, and as the priority moves."""
    import json
    text = records.texts()
    job = Job(id=12, spec=JobSpec(script="x", name='j "é"\n', cwd="/w", output="%x-%j.out",
                                  array="0-3%2"), submit_time=1.7e9)
    other = Job(id=13, spec=JobSpec(script="x", name="k", cwd="/w"), submit_time=1.7e9,
                alloc={"n1": [0, 1], "n2": [2]})

    def expected(*jobs: Job) -> str:
        return json.dumps({"schema_version": 1, "jobs": [job_record()(j) for j in jobs]},
                          indent=2) + "\n"
    assert _document([], capsys) == expected()
    assert _document([text(job), text(other)], capsys) == expected(job, other)
    for name, value in _changes(job):
        was = dict(job.__dict__)
        setattr(job, name, value)
        assert _document([text(job)], capsys) == expected(job), name
        job.__dict__.update(was)
        assert _document([text(job), text(other)], capsys) == expected(job, other), name
        setattr(job, name, value)
    text(job)
    kept = job.__dict__["_listed"][2][0]
    for priority in (5, 70_000, -3, 2**40):  # spliced, not remade
        job.priority = priority
        assert _document([text(other), text(job)], capsys) == expected(other, job)
        assert job.__dict__["_listed"][2][0] is kept
