"""gqnode's outbox: reports are written in groups, sent once on disk (from memory when the disk
is full), and kept until acked."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from gq.messages import Report
from gq.node.outbox import Outbox


def _r(job_id: int, event: str = "started", **more: object) -> Report:
    fields: dict[str, object] = {"seq": 0, **more}
    return Report(node="n1", job_id=job_id, restart=0, event=event, time=1.0,
                  **fields)  # type: ignore[arg-type]


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_reports_are_sent_only_once_committed_and_a_turn_is_one_file(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    seqs = [box.put(_r(i)) for i in range(3)]
    assert box.due(0.0, 2.0) == [], "a report not on disk must not be sent"
    assert len(box) == 3 and [e.job_id for e in box.entries()] == [0, 1, 2]
    box.commit()
    assert len(_files(tmp_path)) == 1, "one turn's reports are one file (one fsync)"
    assert [e.seq for e in box.due(0.0, 2.0)] == seqs
    assert box.due(1.0, 2.0) == [], "sent and not yet due again"
    assert [e.seq for e in box.due(2.0, 2.0)] == seqs, "unacked reports are resent"


def test_a_group_file_goes_with_its_last_ack_and_survives_until_then(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    first, second = box.put(_r(1)), box.put(_r(2))
    box.commit()
    assert box.ack(first) == _r(1, seq=first)
    assert len(_files(tmp_path)) == 1, "the file still holds an unacked report"
    reloaded = Outbox(tmp_path)
    # A restart resends what the file holds; the acked one again too, which gqd ignores.
    assert reloaded.entries() == [_r(1, seq=first), _r(2, seq=second)]
    assert box.ack(second) is not None
    assert _files(tmp_path) == []
    assert box.ack(second) is None


def test_reports_of_an_older_gqnode_one_per_file_are_read(tmp_path: Path) -> None:
    old = {"node": "n1", "seq": 5, "job_id": 9, "restart": 0, "event": "finished", "time": 2.0,
           "state": "COMPLETED", "exit_code": 0, "note": None}
    (tmp_path / f"{5:016d}.msg").write_bytes(msgpack.packb(old))
    (tmp_path / f"{6:016d}.msg").write_bytes(b"\xc1junk")
    # Not a report (no node, a bad event time): dropped, and its file with it.
    (tmp_path / f"{7:016d}.msg").write_bytes(msgpack.packb([{"job_id": 9, "seq": 7}]))
    box = Outbox(tmp_path)
    assert box.entries() == [Report(node="n1", seq=5, job_id=9, restart=0, event="finished",
                                    time=2.0, state="COMPLETED", exit_code=0)]
    assert _files(tmp_path) == [f"{5:016d}.msg"], "junk is removed"
    assert box.put(_r(10)) > 5, "sequence numbers only grow"
    box.ack(5)
    assert _files(tmp_path) == []


def test_a_failed_commit_sends_from_memory_and_writes_once_it_can(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "box")
    first, second = box.put(_r(1)), box.put(_r(2))
    (tmp_path / "box").rmdir()  # the write fails as on a full disk
    with pytest.raises(OSError):
        box.commit()
    assert [e.seq for e in box.due(0.0, 2.0)] == [first, second], "sent at once, from memory"
    assert box.unwritten == 2 and len(box) == 2
    assert box.ack(first) == _r(1, seq=first)  # gqd has it: it is never written
    third = box.put(_r(3))
    (tmp_path / "box").mkdir()  # space again
    box.commit()
    assert box.unwritten == 0 and len(_files(tmp_path / "box")) == 1
    # What gqd has not acked is on disk now: a restart from here loses none of it.
    assert [e.job_id for e in Outbox(tmp_path / "box").entries()] == [2, 3]
    assert [e.seq for e in box.due(1.0, 2.0)] == [third], "the others were sent already"
    assert [e.seq for e in box.due(2.0, 2.0)] == [second], "and are resent until acked"
    box.ack(second)
    box.ack(third)
    assert _files(tmp_path / "box") == []


class _NoSignals:
    """Stands in for service.Signals, whose handlers would outlive the test in pytest."""

    def watch_children(self) -> None:
        pass


def test_a_restarted_gqnode_reports_an_end_its_outbox_did_not_keep(tmp_path: Path) -> None:
    # An end is put in the outbox and written at the end of the loop's turn; a gqnode killed in
    # between loses it, and the run's directory (the status the shepherd wrote) stands for it.
    from gq.node import shepherd
    from gq.node.daemon import NodeDaemon
    from gq.node.gpus import open_gpus

    jobs = tmp_path / "jobs"
    for job_id in (7, 8):
        (jobs / f"{job_id}.0").mkdir(parents=True)
        (jobs / f"{job_id}.0" / shepherd.STATUS_FILE).write_text(
            '{"state": "COMPLETED", "exit_code": 0, "end_time": 1.0, "note": ""}')
    kept = Outbox(tmp_path / "outbox")
    kept.put(_r(8, "finished", state="COMPLETED", exit_code=0, note=""))
    kept.commit()
    node = NodeDaemon("n1", "tcp://127.0.0.1:9", tmp_path, open_gpus("1"), cpus=1, mem=1,
                      addr="n1", heartbeat_s=1.0, signals=_NoSignals())  # type: ignore[arg-type]
    try:
        node.adopt()
        ends = [(e.job_id, e.state) for e in node.outbox.entries() if e.event == "finished"]
        assert sorted(ends) == [(7, "COMPLETED"), (8, "COMPLETED")], "each end once"
        assert node.runs == {}
    finally:
        node.close()
