"""gq api with real Unix users (useradd; CI runs as root) on a system cluster: a token acts as
its own user, whose jobs run as them; another user's job is a 403 to it, its events are not in
its stream, and its listings hold only its own jobs; an admin's token sees everyone's."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apisite import ApiSite, api_cluster
from tests.conftest import prepare, wait_for
from tests.test_users import User, system, top, users  # noqa: F401 - fixtures

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create the test users (CI runs as root)")


@pytest.fixture(scope="module")
def site(top: Path, users: dict[str, User]) -> Iterator[ApiSite]:  # noqa: F811
    (top / "cluster").mkdir()
    live = prepare(top / "cluster")
    with api_cluster(live, change=system(top, users)) as site:
        yield site


def _spec(user: User, command: str) -> dict[str, object]:
    return {"wrap": command, "cwd": str(user.work), "gpus": 1, "output": "api-%j.out",
            "env": {"PATH": os.environ["PATH"]}}


def test_tokens_act_as_their_users_and_see_only_their_own_jobs(
        site: ApiSite, users: dict[str, User]) -> None:  # noqa: F811
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    # root (an admin, over gqd's ipc socket) makes each user a token, as `gq token create
    # --user NAME` does; a user on a login host makes their own.
    tokens = {u.name: site.token(user=u.name, name="tests") for u in (alice, bob, carol)}
    with site.http(tokens[alice.name]) as a, site.http(tokens[bob.name]) as b, \
            site.http(tokens[carol.name]) as admin:
        (job,) = a.post("/v1/jobs", json=_spec(alice, "id -u; sleep 300")).json()["ids"]
        (bobs,) = b.post("/v1/jobs", json=_spec(bob, "true")).json()["ids"]
        wait_for(lambda: a.get(f"/v1/jobs/{job}").json()["state"] == "RUNNING", "alice's job")
        assert a.get(f"/v1/jobs/{job}").json()["user"] == alice.name
        # RUNNING comes when gqd ordered the launch: the file is made on the node a moment later.
        out = wait_for(lambda: (r := a.get(f"/v1/jobs/{job}/output")).status_code == 200
                       and r.text, "alice's output")
        assert out.strip() == str(alice.uid), "her job runs as her"
        for call in (lambda: b.get(f"/v1/jobs/{job}"), lambda: b.delete(f"/v1/jobs/{job}"),
                     lambda: b.post(f"/v1/jobs/{job}/hold"),
                     lambda: b.get(f"/v1/jobs/{job}/output")):
            refused = call()
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"] == {
                "code": "permission_denied",
                "message": f"permission denied: job {job} belongs to {alice.name}"}
        assert b.get("/v1/jobs", params={"user": alice.name}).status_code == 403
        assert {j["user"] for j in b.get("/v1/jobs", params={"all": 1}).json()["jobs"]} == {
            bob.name}
        bob_sees = b.get("/v1/events", params={"since": 0, "kind": "job"}).json()["events"]
        assert {e["user"] for e in bob_sees} == {bob.name} and bobs in {e["id"] for e in bob_sees}
        assert b.get("/v1/events", params={"since": 0, "user": alice.name}).status_code == 403
        # An admin's token sees and acts on anyone's job.
        assert admin.get(f"/v1/jobs/{job}").json()["user"] == alice.name
        assert {e["user"] for e in admin.get("/v1/events", params={
            "since": 0, "kind": "job"}).json()["events"]} == {alice.name, bob.name}
        assert admin.delete(f"/v1/jobs/{job}").json() == {"done": [str(job)]}
        assert a.get(f"/v1/jobs/{job}").json()["state"] == "CANCELLED"
