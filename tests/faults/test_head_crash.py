"""Fault 1: gqd SIGKILLed while clients submit; no acknowledged job is lost or given twice."""

from __future__ import annotations

import os
import signal
import threading

from gq.client import Client
from gq.errors import UnreachableError
from tests.conftest import LiveCluster, wait_for
from tests.faults.conftest import MakeCluster

CLIENTS = 4
PER_CLIENT = 250
#: gqd is killed once this many submits have been answered: well inside the stream.
KILL_AFTER = 300


class Submitter(threading.Thread):
    """One client submitting PER_CLIENT jobs one request at a time, retrying through an outage.

    Each attempt has its own job name, so an id can be checked against the job it was given for.
    """

    def __init__(self, live: LiveCluster, index: int):
        super().__init__(daemon=True)
        self.live, self.index = live, index
        self.received: list[tuple[int, str]] = []
        self.unanswered = 0  # requests that may or may not have been committed
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.live.config(), timeout_s=5.0) as client:
                attempt = 0
                while len(self.received) < PER_CLIENT:
                    attempt += 1
                    name = f"c{self.index}-a{attempt}"
                    try:
                        (job_id,) = client.submit([self.live.spec("#!/bin/sh\ntrue\n", name=name)])
                    except UnreachableError:
                        self.unanswered += 1
                        continue
                    self.received.append((job_id, name))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc


def test_head_killed_during_concurrent_submits_loses_no_acknowledged_job(
        make_cluster: MakeCluster) -> None:
    live = make_cluster(nodes=1, fake_gpus="1")
    # A drained node keeps every job queued: nothing needs to run for this test.
    live.gq("admin", "drain", "node1", "--reason", "hold the queue", check=True)
    clients = [Submitter(live, i) for i in range(CLIENTS)]
    for c in clients:
        c.start()
    answered = lambda: sum(len(c.received) for c in clients)  # noqa: E731
    wait_for(lambda: answered() >= KILL_AFTER or any(c.error for c in clients),
             f"{KILL_AFTER} submits to be answered")
    head = live.head_pid()
    os.kill(head, signal.SIGKILL)
    at_kill = answered()
    wait_for(lambda: live.head_pid() is None, "gqd to die")
    assert live.gq("up").returncode == 0, live.log("gqd")
    for c in clients:
        c.join(timeout=120)
        assert not c.is_alive(), f"client {c.index} did not finish its submits"
        assert c.error is None, f"client {c.index} failed: {c.error!r}"
    assert at_kill < CLIENTS * PER_CLIENT, "gqd died after the stream had ended: nothing shown"

    received = [r for c in clients for r in c.received]
    ids = [job_id for job_id, _ in received]
    assert len(ids) == CLIENTS * PER_CLIENT
    assert len(set(ids)) == len(ids), "an id was given to two submits"
    with live.client() as c:
        queued = {j["id"]: j["name"] for j in c.queue()}
    lost = [(i, n) for i, n in received if queued.get(i) != n]
    assert not lost, f"{len(lost)} acknowledged jobs missing or changed, e.g. {lost[:5]}"
    # Only submits whose answer the crash swallowed may have been kept without an id.
    unanswered = sum(c.unanswered for c in clients)
    assert len(queued) - len(ids) <= unanswered, (len(queued), len(ids), unanswered)
