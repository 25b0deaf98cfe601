"""Fault: gqd SIGKILLed while a consumer follows the event stream through gq api (issue 19,
done-when 3). Jobs are submitted through the API before, during and after the crash; the
consumer's stream goes on across the restart (gq api asks again from the last event it sent),
and it also drops its own connection once and reconnects with Last-Event-ID. It receives every
event gqd committed exactly once, in sequence order, every acknowledged submit among them, and
each job's last event is the state the job ended in."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.apisite import ApiSite, api_cluster
from tests.conftest import DEADLINE_S, prepare, wait_for

#: Submits before the crash, and after it.
BEFORE, AFTER = 30, 30
#: The consumer drops its connection after this many events and reconnects with Last-Event-ID.
RECONNECT_AFTER = 20
_ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"})


class Consumer(threading.Thread):
    def __init__(self, site: ApiSite, token: str, since: int):
        super().__init__(daemon=True)
        self.site, self.token, self.last = site, token, since
        self.got: list[dict[str, Any]] = []
        self.connections = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._connect()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc

    def _connect(self) -> None:
        """One SSE connection, from the last event received (as EventSource reconnects)."""
        self.connections += 1
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(self.last)}
        with httpx.Client(base_url=self.site.url, timeout=DEADLINE_S, headers={
                "Authorization": f"Bearer {self.token}"}) as http, \
                http.stream("GET", "/v1/events", headers=headers) as resp:
            assert resp.status_code == 200, resp.read()
            data = None
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    data = json.loads(line[len("data: "):])
                elif line == "" and data is not None:
                    self.got.append(data)
                    self.last = data["seq"]
                    data = None
                    if len(self.got) == RECONNECT_AFTER and self.connections == 1:
                        return  # drop it: the next connection resumes with Last-Event-ID
                if self.stop.is_set():
                    return


def _submit(http: httpx.Client, site: ApiSite, n: int) -> list[int]:
    ids = []
    for i in range(n):
        resp = http.post("/v1/jobs", json=site.spec(f"exit {i % 3}", gpus=0, name=f"j{i}"))
        assert resp.status_code == 201, resp.text
        ids += resp.json()["ids"]
    return ids


def test_the_event_stream_survives_a_gqd_crash_each_event_exactly_once(tmp_path: Path) -> None:
    with api_cluster(prepare(tmp_path), fake_gpus="2") as site:
        token = site.token(name="consumer")
        with site.http(token) as http:
            since = int(http.get("/v1/events").json()["last"])
            consumer = Consumer(site, token, since)
            consumer.start()
            acked = _submit(http, site, BEFORE)
            head = site.live.head_pid()
            assert head is not None
            os.kill(head, signal.SIGKILL)
            wait_for(lambda: site.live.head_pid() is None, "gqd to die")
            assert site.live.gq("up").returncode == 0, site.live.log("gqd")
            wait_for(lambda: http.get("/v1/healthz").status_code == 200,
                     "gq api to reconnect to the new gqd")
            acked += _submit(http, site, AFTER)
            final = {}
            for job in acked:
                def ended(job: int = job) -> dict[str, Any] | None:
                    got = http.get(f"/v1/jobs/{job}").json()
                    return got if got["state"] in _ENDED else None
                final[job] = wait_for(ended, f"job {job} to end")["state"]
            everything = http.get("/v1/events", params={"since": since, "limit": 10_000}).json()
        committed = [e["seq"] for e in everything["events"]]
        wait_for(lambda: consumer.last >= committed[-1] or consumer.error,
                 "the consumer to catch up", timeout=DEADLINE_S)
        consumer.stop.set()
        assert consumer.error is None, consumer.error
        got = [e["seq"] for e in consumer.got]
        assert consumer.connections >= 2, "it reconnected with Last-Event-ID"
        assert "lost its connection to gqd" in site.live.log("api"), "the stream saw the crash"
        assert got == committed == list(range(since + 1, since + 1 + len(committed))), \
            "every committed event exactly once, in order, none skipped"
        assert consumer.got == everything["events"]
        jobs = [e for e in consumer.got if e["kind"] == "job"]
        assert {e["id"] for e in jobs if e["state"] == "PENDING"} >= set(acked)
        for job, state in final.items():
            assert [e["state"] for e in jobs if e["id"] == job][-1] == state
