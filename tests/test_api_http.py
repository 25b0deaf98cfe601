"""gq api over HTTP (docs/API.md; issue 19, done-when 1): real gqd, gqnode and gq api
processes, httpx as the client. Submit one job, a list and an array; follow them through the
event stream to their ends; cancel; read output; no token, a bad one, a revoked one, a
read-only one; the limits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gq.config import Config
from tests.apisite import ApiSite, api_cluster
from tests.conftest import DEADLINE_S, prepare, wait_for


def _limits(cfg: Config) -> None:
    cfg.api.max_jobs_per_submit = 50
    cfg.api.max_body_bytes = 256 * 1024
    cfg.api.rate_per_s, cfg.api.rate_burst = 5.0, 400


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiSite]:
    live = prepare(tmp_path_factory.mktemp("api"))
    with api_cluster(live, change=_limits) as site:
        yield site


@pytest.fixture(scope="module")
def token(site: ApiSite) -> str:
    return site.token(name="tests")


def _follow(site: ApiSite, token: str, since: int, until: Any, **params: Any
            ) -> list[dict[str, Any]]:
    """Events from the SSE stream after `since`, until `until(events so far)` holds."""
    got: list[dict[str, Any]] = []
    headers = {"Accept": "text/event-stream", "Last-Event-ID": str(since)}
    deadline = time.monotonic() + DEADLINE_S
    with site.http(token) as http, http.stream("GET", "/v1/events", params=params,
                                               headers=headers) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(
            "text/event-stream")
        fields: dict[str, str] = {}
        for line in resp.iter_lines():
            assert time.monotonic() < deadline, f"events so far: {got}"
            if line:
                key, _, value = line.partition(": ")
                fields[key] = value
                continue
            if "data" in fields:
                event = json.loads(fields["data"])
                assert (fields["id"], fields["event"]) == (str(event["seq"]), event["kind"])
                got.append(event)
                if until(got):
                    return got
            fields = {}
    raise AssertionError(f"the stream ended: {got}")


def _last_seq(site: ApiSite, token: str) -> int:
    with site.http(token) as http:
        return int(http.get("/v1/events").json()["last"])


def test_submit_one_a_list_and_an_array_and_follow_them_to_their_ends(site: ApiSite,
                                                                     token: str) -> None:
    since = _last_seq(site, token)
    with site.http(token) as http:
        one = http.post("/v1/jobs", json=site.spec("echo one; exit 3", name="one"))
        assert one.status_code == 201, one.text
        listed = http.post("/v1/jobs", json=[site.spec("echo two", name="two"),
                                             site.spec("echo $GQ_ARRAY_TASK_ID",
                                                       array="0-2", name="arr")])
        assert listed.status_code == 201, listed.text
        (a,), (b, arr) = one.json()["ids"], listed.json()["ids"]
        assert (b, arr) == (a + 1, a + 2)
        shown = http.get(f"/v1/jobs/{arr}_1").json()
        assert (shown["name"], shown["array_job_id"], shown["array_index"]) == ("arr", arr, 1)
    ended = {str(a), str(b), f"{arr}_0", f"{arr}_1", f"{arr}_2"}
    got = _follow(site, token, since, lambda evs: ended <= {
        e["job_id"] for e in evs if e["kind"] == "job" and e["state"] not in ("PENDING",
                                                                              "RUNNING")})
    seqs = [e["seq"] for e in got]
    assert seqs == sorted(set(seqs)) and seqs[0] == since + 1, "in order, each once"
    jobs = [e for e in got if e["kind"] == "job"]
    states = {ref: [e["state"] for e in jobs if e["job_id"] == ref] for ref in ended}
    assert states[str(a)] == ["PENDING", "RUNNING", "FAILED"]
    assert all(states[ref] == ["PENDING", "RUNNING", "COMPLETED"] for ref in ended - {str(a)})
    assert next(e for e in jobs if e["job_id"] == str(a) and e["state"] == "FAILED")[
        "exit_code"] == 3
    # The same through the JSON page, filtered by array.
    with site.http(token) as http:
        page = http.get("/v1/events", params={"since": since, "array": arr}).json()
        assert {e["job_id"] for e in page["events"]} == {f"{arr}_{i}" for i in range(3)}
        out = http.get(f"/v1/jobs/{arr}_2/output")
        assert (out.status_code, out.text) == (200, "2\n")
        assert http.get(f"/v1/jobs/{a}/output", params={"offset": 2}).text == "e\n"


def test_list_cancel_hold_release_and_follow_output(site: ApiSite, token: str) -> None:
    with site.http(token) as http:
        (slow,) = http.post("/v1/jobs", json=site.spec(
            "for i in 1 2 3; do echo line $i; sleep 0.5; done", name="slow")).json()["ids"]
        (held,) = http.post("/v1/jobs", json=site.spec("true", hold=True)).json()["ids"]
        with http.stream("GET", f"/v1/jobs/{slow}/output", params={"follow": 1}) as resp:
            assert resp.status_code == 200
            text = "".join(resp.iter_text())
        assert text == "line 1\nline 2\nline 3\n", "followed until the job ended"
        page = http.get("/v1/jobs", params={"state": "PD", "limit": 1})
        assert page.status_code == 200 and [j["id"] for j in page.json()["jobs"]] == [held]
        assert http.get("/v1/jobs", params={"name": "nope"}).json()["jobs"] == []
        assert http.post(f"/v1/jobs/{held}/release").json() == {"done": [str(held)]}
        again = http.post(f"/v1/jobs/{held}/release")
        assert (again.status_code, again.json()["error"]) == (409, {
            "code": "refused", "message": f"job {held} is not held"})
        (sleeper,) = http.post("/v1/jobs", json=site.spec("sleep 300")).json()["ids"]
        wait_for(lambda: http.get(f"/v1/jobs/{sleeper}").json()["state"] == "RUNNING",
                 "the sleeper to run")
        assert http.delete(f"/v1/jobs/{sleeper}").json() == {"done": [str(sleeper)]}
        assert http.get(f"/v1/jobs/{sleeper}").json()["state"] == "CANCELLED"
        gone = http.delete(f"/v1/jobs/{sleeper}")
        assert gone.status_code == 409 and "already finished" in gone.json()["error"]["message"]
        missing = http.get("/v1/jobs/99999")
        assert (missing.status_code, missing.json()["error"]) == (404, {
            "code": "not_found", "message": "job 99999 does not exist"})
        assert http.get("/v1/nodes").json()["nodes"][0]["name"] == "node1"


def test_paging_by_cursor_lists_every_job_once(site: ApiSite, token: str) -> None:
    with site.http(token) as http:
        ids = http.post("/v1/jobs", json=[site.spec("true", hold=True)] * 7).json()["ids"]
        seen, cursor = [], None
        while True:
            params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            page = http.get("/v1/jobs", params=params).json()
            seen += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert [i for i in seen if i in ids] == ids
        for job in ids:
            http.delete(f"/v1/jobs/{job}")


def test_no_token_a_bad_one_a_revoked_one_and_a_read_only_one(site: ApiSite) -> None:
    with site.http() as http:
        bare = http.get("/v1/jobs")
        assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")
        assert bare.json()["error"]["code"] == "unauthenticated"
        assert http.get("/v1/healthz").json() == {"ok": True, "gqd": True}
        assert http.get("/openapi.json").json()["info"]["title"] == "gq api"
    with site.http("gq_" + "x" * 43) as http:
        made_up = http.get("/v1/nodes")
        assert made_up.status_code == 401 and "unknown or was revoked" in made_up.text
    with site.live.client() as c:
        made = c.token_create(name="short-lived")
        reader = c.token_create(name="reader", read_only=True)["token"]
    with site.http(made["token"]) as http:
        assert http.get("/v1/nodes").status_code == 200
        with site.live.client() as c:
            assert c.token_revoke([made["id"]])["done"] == [made["id"]]
        assert http.get("/v1/nodes").status_code == 401, "a revoke works on the next request"
    with site.http(reader) as http:
        assert http.get("/v1/jobs").status_code == 200
        refused = http.post("/v1/jobs", json=site.spec("true"))
        assert refused.status_code == 403 and "read-only" in refused.json()["error"]["message"]
    # A token cannot make tokens: only a user the kernel vouches for can.
    result = site.live.gq("token", "list", "--json", check=True)
    assert "reader" in result.stdout and reader not in result.stdout


def test_bad_input_is_a_400_with_the_clis_wording_and_limits_hold(site: ApiSite,
                                                               token: str) -> None:
    with site.http(token) as http:
        cases = [({"wrap": "true"}, "give cwd"),
                 ({**site.spec("true"), "gpu": 2}, "unknown field 'gpu'"),
                 ({**site.spec("true"), "script": "#!/bin/sh\n"}, "not both"),
                 ({**site.spec("true"), "gpus": 999}, "bad --gpus-per-node 999: expected 0..64"),
                 ({**site.spec("true"), "array": "5-1"}, "--array"),
                 ({**site.spec("true"), "qos": "gold"}, "unknown QOS 'gold'")]
        for body, wording in cases:
            resp = http.post("/v1/jobs", json=body)
            assert resp.status_code in (400, 409) and wording in resp.json()["error"]["message"], \
                (body, resp.text)
        assert http.post("/v1/jobs", content=b"{nope").status_code == 400
        many = http.post("/v1/jobs", json=[site.spec("true")] * 51)
        assert many.status_code == 413 and "max_jobs_per_submit" in many.text
        big = http.post("/v1/jobs", json=site.spec("x" * 300_000))
        assert big.status_code == 413 and "max_body_bytes" in big.text
        assert http.get("/v1/jobs", params={"limit": 0}).status_code == 400
        assert http.get("/v1/jobs/12x").status_code in (400, 404)
        assert http.get("/v1/nope").json()["error"]["code"] == "not_found"


def test_a_tokens_rate_limit_answers_429_with_retry_after(site: ApiSite) -> None:
    limited = site.token(name="flood")
    statuses = []
    with site.http(limited) as http:
        for _ in range(450):
            resp = http.get("/v1/nodes")
            statuses.append(resp.status_code)
            if resp.status_code == 429:
                assert int(resp.headers["retry-after"]) >= 1
                assert resp.json()["error"]["code"] == "rate_limited"
                break
    assert statuses[-1] == 429 and len(statuses) > 300, "the burst is allowed, then limited"
    with site.http(site.token(name="other")) as http:
        assert http.get("/v1/nodes").status_code == 200, "another token is not limited by it"


def test_output_not_readable_where_gq_api_runs_says_so(site: ApiSite, token: str) -> None:
    with site.http(token) as http:
        (job,) = http.post("/v1/jobs", json=site.spec("echo hi", output="local-%j.out")
                           ).json()["ids"]
        wait_for(lambda: http.get(f"/v1/jobs/{job}").json()["state"] not in (
            "PENDING", "RUNNING"), "the job to end")
        # As if it were on the node's own disk, which gq api's host does not share.
        (site.live.work / f"local-{job}.out").unlink()
        resp = http.get(f"/v1/jobs/{job}/output")
        assert resp.status_code == 404
        assert f"local-{job}.out does not exist (yet) where gq api runs" in \
            resp.json()["error"]["message"]


def test_gq_events_and_gq_token_from_the_cli(site: ApiSite) -> None:
    live = site.live
    follow = subprocess.Popen([sys.executable, "-m", "gq.cli.main", "events", "--follow",
                               "--json", "--kind", "job"], env=live.env, cwd=live.work,
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # --follow starts from now: let it ask before the job exists
        job = live.submit("--wrap", "true")
        seen: list[dict[str, Any]] = []
        assert follow.stdout is not None
        for line in follow.stdout:
            seen.append(json.loads(line))
            if seen[-1]["id"] == job and seen[-1]["state"] == "COMPLETED":
                break
        assert [e["state"] for e in seen if e["id"] == job] == ["PENDING", "RUNNING",
                                                                  "COMPLETED"]
    finally:
        follow.kill()
        follow.wait()
        if follow.stdout is not None:
            follow.stdout.close()
    listed = live.gq("events", "--since", str(seen[0]["seq"] - 1), "--job", str(job), check=True)
    assert [line.split()[-1] for line in listed.stdout.splitlines()][-1] == "0", listed.stdout
    made = json.loads(live.gq("token", "create", "--read-only", "--name", "cli", "--expires",
                              "2h", "--json", check=True).stdout)
    assert made["read_only"] and made["expires"] - made["created"] == 7200
    with site.http(made["token"]) as http:
        assert http.get("/v1/nodes").status_code == 200
    tokens = json.loads(live.gq("token", "list", "--json", check=True).stdout)["tokens"]
    assert made["id"] in [t["id"] for t in tokens] and "token" not in tokens[0]
    assert live.gq("token", "revoke", str(made["id"])).returncode == 0
    assert live.gq("token", "revoke", str(made["id"])).returncode == 1, "already gone"
    with site.http(made["token"]) as http:
        assert http.get("/v1/nodes").status_code == 401
