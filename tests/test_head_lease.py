"""gqnode's head lease (gq/node/lease.py): renewed from when the answered heartbeat was sent,
kept in the state directory for a restarted gqnode and for the shepherds."""

from __future__ import annotations

import math
from pathlib import Path

from gq.node import lease
from gq.node.lease import HeadLease, lease_end


def test_an_answer_renews_the_lease_from_when_its_heartbeat_was_sent(tmp_path: Path) -> None:
    held = HeadLease(10.0, tmp_path / lease.FILE, now=100.0)
    assert held.until == 110.0 and not held.expired(109.9) and held.expired(110.0)
    first, second = held.beat(101.0), held.beat(103.0)
    assert held.answered(second) and held.until == 113.0
    # A late answer to an older heartbeat renews nothing, nor does one never sent.
    assert not held.answered(first) and not held.answered(99)
    assert held.until == 113.0
    assert lease_end(tmp_path) == 113.0, "the shepherds see the renewal"


def test_a_restarted_gqnode_keeps_the_lease_it_had_not_a_fresh_one(tmp_path: Path) -> None:
    held = HeadLease(10.0, tmp_path / lease.FILE, now=100.0)
    held.answered(held.beat(104.0))
    again = HeadLease(10.0, tmp_path / lease.FILE, now=200.0)
    assert again.until == 114.0 and again.expired(200.0)
    # A file of another boot means nothing: a fresh lease.
    (tmp_path / lease.FILE).write_text("another-boot 114.0\n")
    assert HeadLease(10.0, tmp_path / lease.FILE, now=200.0).until == 210.0


def test_no_lease_answers_nothing_and_removes_an_old_lease_file(tmp_path: Path) -> None:
    HeadLease(10.0, tmp_path / lease.FILE, now=100.0)
    assert lease_end(tmp_path) == 110.0
    off = HeadLease(0.0, tmp_path / lease.FILE, now=100.0)
    assert off.beat(101.0) == 0 and off.until == math.inf and not off.expired(1e12)
    assert not (tmp_path / lease.FILE).exists() and lease_end(tmp_path) == math.inf
