"""Listings longer than a page, on a live cluster: every job comes back, once, oldest first,
through the client and the CLI; no reply outgrows the message size limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from gq import defaults, protocol
from tests.conftest import LiveCluster

#: More than two pages of jobs (the client asks for PAGE_JOBS at a time).
MANY = 2 * defaults.PAGE_JOBS + 7


def _pages(client, msg_type: str, **fields) -> list[list[dict]]:  # noqa: ANN001
    """A listing as the pages the head sends, asked for as the client does."""
    pages, after = [], 0
    while True:
        reply = client.request(msg_type, after=after, limit=defaults.PAGE_JOBS, **fields)
        pages.append(reply["jobs"])
        if reply["next"] is None:
            return pages
        assert reply["next"] == reply["jobs"][-1]["id"]
        after = reply["next"]


def test_listings_of_many_pages_hold_every_job_in_order(cluster: LiveCluster) -> None:
    first = cluster.submit("--hold", "-J", "single", "--wrap", "true")
    array = cluster.submit("--hold", "-J", "many", "--array", f"0-{MANY - 1}", "--wrap", "true")
    last = cluster.submit("--hold", "-J", "single", "--wrap", "true")
    expected = [first, *range(array, array + MANY), last]
    with cluster.client() as c:
        pages = _pages(c, protocol.QUEUE)
        assert [len(p) for p in pages] == [defaults.PAGE_JOBS] * 2 + [9]
        assert [j["id"] for p in pages for j in p] == expected
        assert [j["id"] for j in c.queue()] == expected
        assert [j["id"] for j in c.queue(fields=["id"])] == expected
        assert all(list(j) == ["id", "name"] for j in c.queue(fields=["id", "name"]))
        history = c.history(since=0, until=time.time() + 60)
        assert [j["id"] for j in history] == expected
        # A client that asks for no page (an older one) still gets everything at once.
        assert [j["id"] for j in c.request(protocol.QUEUE)["jobs"]] == expected
    doc = json.loads(cluster.gq("queue", "--json", check=True).stdout)
    assert [j["id"] for j in doc["jobs"]] == expected
    assert [j["job_id"] for j in doc["jobs"][1:3]] == [f"{array}_0", f"{array}_1"]
    doc = json.loads(cluster.gq("history", "--json", check=True).stdout)
    assert [j["id"] for j in doc["jobs"]] == expected
    lines = cluster.gq("queue", "-p", "--start", check=True).stdout.splitlines()
    assert [ln.split("|")[0] for ln in lines[1:]] == [str(first), f"{array}_[0-{MANY - 1}]",
                                                     str(last)]
    # `gq queue --json | head -1`: the reader goes away; gq ends quietly, with the status of
    # a closed pipe (141, as every command: tests/test_exit.py).
    with subprocess.Popen([sys.executable, "-m", "gq.cli.main", "queue", "--json"],
                          env=cluster.env, cwd=cluster.work, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout.readline() == b"{\n"
        proc.stdout.close()
        assert proc.communicate(timeout=60)[1] == b"" and proc.returncode == 141
    # Off a terminal the listing loads neither typer nor rich (python -X importtime agrees).
    code = ("import sys\nfrom gq.cli.main import main\nrc = main(sys.argv[1:])\n"
            "print(rc, [m for m in ('typer', 'rich') if m in sys.modules], file=sys.stderr)\n")
    for args in (["queue", "-p"], ["queue"], ["show", str(last)], ["queue", "--json"]):
        done = subprocess.run([sys.executable, "-c", code, *args], env=cluster.env,
                              cwd=cluster.work, capture_output=True, text=True, timeout=60)
        assert done.stderr == "0 []\n" and str(last) in done.stdout, args
    # The jobs of one request are numbered in its order, an array's tasks together.
    script = "#!/bin/sh\ntrue\n"
    with cluster.client() as c:
        ids = c.submit([cluster.spec(script, hold=True), cluster.spec(script, hold=True,
                                                                      array="0-2"),
                        cluster.spec(script, hold=True)])
        assert ids == [last + 1, last + 2, last + 5]
        assert [j["job_id"] for j in c.queue(fields=["job_id"])][-5:] == [
            str(last + 1), f"{last + 2}_0", f"{last + 2}_1", f"{last + 2}_2", str(last + 5)]


def test_a_page_stops_short_of_the_message_limit(cluster: LiveCluster) -> None:
    """Jobs with long names: a page of PAGE_JOBS of them would be over the limit."""
    name = "n" * protocol.MAX_STR
    count = defaults.MAX_MESSAGE_BYTES // protocol.MAX_STR + 100
    array = cluster.submit("--hold", "-J", name, "--array", f"0-{count - 1}", "--wrap", "true")
    with cluster.client() as c:
        pages = _pages(c, protocol.QUEUE)
        assert len(pages) >= 3 and all(len(p) < defaults.PAGE_JOBS for p in pages)
        assert [j["id"] for p in pages for j in p] == list(range(array, array + count))
    plain = cluster.gq("queue", "-t", "PD", check=True).stdout.splitlines()
    assert len(plain) == 2 and name in plain[1]  # one folded row for the array
    doc = json.loads(cluster.gq("queue", "--json", check=True).stdout)
    assert len(doc["jobs"]) == count and doc["jobs"][-1]["name"] == name


def test_a_listing_shows_each_change_of_a_job_whose_record_gqd_keeps(
        cluster: LiveCluster) -> None:
    """gqd sends a job's kept record again until the job changes (gq/head/records.py): every
    change (update, release, start, a refused update, the end) shows in the next listing,
    through both field sets (`--json`'s and the table's) and the CLI."""
    job = cluster.submit("--hold", "-J", "before", "-o", "out-%x-%j.txt", "-t", "10",
                         "--wrap", "sleep 60")
    from gq.cli import render

    def listed() -> tuple[dict, dict]:
        with cluster.client() as c:
            full = [j for j in c.queue() if j["id"] == job]
            table = [j for j in c.queue(fields=render.QUEUE_FIELDS) if j["id"] == job]
        assert len(full) == len(table) == 1
        assert {k: full[0][k] for k in render.QUEUE_FIELDS} == table[0]
        # The CLI's `--json` joins gqd's kept texts of the jobs: json.dumps' document, the
        # same record (the priority moves with the clock between the two listings).
        out = cluster.gq("queue", "--json", check=True).stdout
        doc = json.loads(out)
        assert out == json.dumps(doc, indent=2) + "\n" and doc["schema_version"] == 1
        [cli] = [j for j in doc["jobs"] if j["id"] == job]
        assert list(cli) == list(full[0])
        assert {**cli, "priority": None} == {**full[0], "priority": None}
        return full[0], table[0]

    def fresh() -> dict:  # what gqd makes anew for one job, for the fields a listing holds
        shown = cluster.show(job)
        return {k: v for k, v in shown.items() if k in listed()[0] and k != "priority"}

    first, _ = listed()
    assert first == listed()[0]  # kept: the same record again
    assert first["name"] == "before" and first["stdout"].endswith(f"out-before-{job}.txt")
    with cluster.client() as c:
        assert c.update([job], name="after", time_limit_s=300)["done"]
        assert not c.update([job], qos="no-such-qos")["done"]  # refused: nothing changes
    now, row = listed()
    assert now["name"] == row["name"] == "after" and now["time_limit_s"] == 300
    assert now["stdout"].endswith(f"out-after-{job}.txt")
    assert {k: v for k, v in now.items() if k != "priority"} == fresh()
    table = cluster.gq("queue", check=True).stdout
    assert "after" in table and "before" not in table
    with cluster.client() as c:
        assert c.release([job])["done"]
    cluster.wait_state(job, "RUNNING")
    now, row = listed()
    assert now["state"] == row["state"] == "RUNNING" and now["hold"] is None
    assert now["node_list"] and now["start_time"] and now["gpu_ids"]
    assert {k: v for k, v in now.items() if k != "priority"} == fresh()
    assert f"{job}" in cluster.gq("queue", "-t", "R", check=True).stdout
    cluster.gq("cancel", str(job), check=True)
    cluster.wait_state(job, "CANCELLED")
    with cluster.client() as c:
        assert job not in [j["id"] for j in c.queue()]
        assert [j["state"] for j in c.queue(all=True) if j["id"] == job] == ["CANCELLED"]
