"""Trusted forwarders (docs/SECURITY.md, WAVE2 1-2): a login host's `gq relay` and gqnode's relay
for its jobs, on a system cluster with real Unix users (useradd; CI runs as root).

gqd, its node and the relay run on this host; the relay's users reach gqd only through it
(their config names only its socket). Each trust rule is shown on real sockets: a client's own
`as_uid` is ignored by gqd's ipc and TCP sockets and replaced by the relay; an api relay may
not use a bare uid; an unknown key gets no answer; a node speaks only for owners of its jobs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from gq import config as config_mod
from gq import keys, protocol
from gq.defaults import NODE_RELAY_SOCKET
from tests.conftest import DEADLINE_S, LiveCluster, prepare, running, wait_for
from tests.test_users import AS_USER, User, top, users  # noqa: F401 - fixtures

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/sbin/useradd"),
    reason="needs root and useradd to create the test users (CI runs as root)")

RELAY = "login1"
API = "api1"
#: Sends requests (type, fields) to an endpoint as a user, with exactly the fields given, and
#: prints the replies (None for no reply) as JSON.
PROBE = r"""
import json, os, sys
import msgpack, zmq
uid, gid, endpoint, requests = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.linger = 0
sock.connect(endpoint)
out = []
for rid, (kind, fields) in enumerate(json.loads(requests), 1):
    sock.send(msgpack.packb({"v": 1, "type": kind, "rid": rid, **fields}, use_bin_type=True))
    out.append(msgpack.unpackb(sock.recv(), raw=False) if sock.poll(20_000) else None)
print(json.dumps(out))
"""


@dataclass
class RelaySite:
    live: LiveCluster
    alice: User
    bob: User
    #: The users' config on the "login host": its only endpoint is the relay's socket.
    login_config: Path
    relay_socket: str
    relay_endpoint: str
    head_ipc: str
    head_tcp: str

    def gq(self, user: User, *args: str) -> subprocess.CompletedProcess[str]:
        groups = ",".join(map(str, user.groups))
        env = {**self.live.env, "GQ_CONFIG": str(self.login_config), "HOME": str(user.home),
               "USER": user.name, "LOGNAME": user.name}
        return subprocess.run(
            [sys.executable, "-c", AS_USER, str(user.uid), str(user.gid), groups, "cli", *args],
            env=env, cwd=user.work, capture_output=True, text=True, timeout=60)

    def submit(self, user: User, *args: str) -> int:
        proc = self.gq(user, "submit", "--parsable", *args)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.strip())

    def probe(self, user: User, endpoint: str, *requests: tuple[str, dict[str, Any]]
              ) -> list[dict[str, Any] | None]:
        proc = subprocess.run([sys.executable, "-c", PROBE, str(user.uid), str(user.gid),
                               endpoint, json.dumps(list(requests))],
                              capture_output=True, text=True, timeout=90)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def node_socket(self) -> str:
        return f"ipc://{self.live.layout.node_dir('node1') / NODE_RELAY_SOCKET}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def relay_site(top: Path, users: dict[str, User]) -> Iterator[RelaySite]:  # noqa: F811
    (top / "cluster").mkdir()
    live = prepare(top / "cluster")
    relay_ep = f"tcp://127.0.0.1:{_free_port()}"
    relay_socket = f"ipc://{top / 'login' / 'relay.sock'}"
    endpoints: list[str] = []

    def system(cfg: config_mod.Config) -> None:
        tcp = [ep for ep in cfg.head.client_endpoints if ep.startswith("tcp://")]
        cfg.head.client_endpoints = [f"ipc://{top / 'run' / 'gqd.sock'}", *tcp]
        endpoints.extend(cfg.head.client_endpoints)
        cfg.auth.owner = ""  # a system cluster: everyone may connect
        cfg.auth.allow_root_jobs = False
        cfg.head.relay_endpoint = cfg.relay.head = relay_ep
        cfg.relay.socket = relay_socket

    live.configure(system)
    keys.ensure(live.layout.keys, [keys.HEAD])
    keys.keygen(live.layout.keys, RELAY, relay=keys.LOGIN)
    keys.keygen(live.layout.keys, API, relay=keys.API)
    login = live.config()
    login.client.endpoints = [relay_socket]
    login_config = top / "login.toml"
    login_config.write_text(config_mod.to_toml(login))
    with running(live, nodes=1, fake_gpus="4") as live, \
            live.layout.log("relay").open("ab") as log:
        relay = subprocess.Popen([sys.executable, "-m", "gq.relay", "--config",
                                  str(live.config_path), "--name", RELAY],
                                 env=live.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            wait_for(lambda: "connected to gqd" in live.log("relay"), "the relay to connect")
            wait_for(lambda: "connected to gqd" in live.log("node1"),
                     "node1's relay to connect")
            yield RelaySite(live, users["alice"], users["bob"], login_config, relay_socket,
                            relay_ep, *endpoints)
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(timeout=30)


def _sleeper(site: RelaySite, user: User) -> int:
    job = site.submit(user, "-t", "10", "--wrap", "sleep 300")
    site.live.wait_state(job, "RUNNING")
    return job


def test_users_submit_wait_and_cancel_through_the_relay_as_themselves(
        relay_site: RelaySite) -> None:
    site, alice, bob = relay_site, relay_site.alice, relay_site.bob
    job = site.submit(alice, "-o", "id.out", "--wrap", "sleep 1; id -u")
    # gqd parks the wait until the job ends; its answer finds its way back through the relay.
    waited = site.gq(alice, "wait", "--json", str(job))
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["jobs"][0]["state"] == "COMPLETED"
    assert (alice.work / "id.out").read_text().strip() == str(alice.uid)
    assert site.live.show(job)["user"] == alice.name
    assert f"submit by {alice.name} (uid {alice.uid}) via relay {RELAY}" in site.live.log("gqd")

    bobs = _sleeper(site, bob)
    refused = site.gq(alice, "cancel", str(bobs))
    assert refused.returncode == 1 and "permission denied" in refused.stderr, refused.stderr
    assert site.live.show(bobs)["state"] == "RUNNING"
    assert site.gq(bob, "cancel", str(bobs)).returncode == 0
    site.live.wait_state(bobs, "CANCELLED")
    hist = site.gq(alice, "history", "--json")
    assert hist.returncode == 0 and job in [j["id"] for j in json.loads(hist.stdout)["jobs"]]


def test_a_clients_own_as_uid_is_ignored_by_gqd_and_replaced_by_the_relay(
        relay_site: RelaySite) -> None:
    site, alice, bob = relay_site, relay_site.alice, relay_site.bob
    bobs = _sleeper(site, bob)
    forged = {"as_uid": bob.uid, "claim_uid": alice.uid, "claim_user": alice.name}
    requests = [("ping", forged), ("cancel", {"ids": [bobs], **forged})]
    direct, tcp, relayed = (site.probe(alice, ep, *requests)
                            for ep in (site.head_ipc, site.head_tcp, site.relay_socket))
    # gqd's own ipc socket: the kernel's uid, whatever the message says.
    assert (direct[0]["uid"], direct[0]["proven"], direct[0]["via"]) == (alice.uid, True, "")
    assert direct[1]["errors"] == {str(bobs): f"permission denied: job {bobs} belongs to "
                                   f"{bob.name}"}
    # TCP: a claim, and only the claim; as_uid is no proof there.
    assert (tcp[0]["uid"], tcp[0]["proven"]) == (alice.uid, False)
    assert not tcp[1]["ok"] and "proven identity" in tcp[1]["error"]
    # The relay replaced the forged as_uid with the kernel's.
    assert (relayed[0]["uid"], relayed[0]["proven"], relayed[0]["via"]) == (
        alice.uid, True, f"relay {RELAY}")
    assert relayed[1]["errors"] == direct[1]["errors"]
    # The relay forwards only well-formed requests, and says what is wrong with the others.
    (bad,) = site.probe(alice, site.relay_socket, ("launch", {}))
    assert bad["code"] == "protocol" and "unknown message type 'launch'" in bad["error"]
    assert site.live.show(bobs)["state"] == "RUNNING"
    site.gq(bob, "cancel", str(bobs))


def _curve_request(site: RelaySite, pair: keys.CurveKeys | str, *requests: dict[str, Any],
                   timeout_ms: int = 20_000) -> list[dict[str, Any] | None]:
    """Requests sent to gqd's relay endpoint with a key pair (by name: from the key dir)."""
    if isinstance(pair, str):
        pair = keys.node_keys(site.live.layout.keys, pair)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_secretkey, sock.curve_publickey = pair.secret, pair.public
    sock.curve_serverkey = pair.server
    sock.connect(site.relay_endpoint)
    out = []
    try:
        for rid, fields in enumerate(requests, 1):
            sock.send_multipart([b"client", protocol.encode(rid=rid, **fields)])
            out.append(msgpack.unpackb(sock.recv_multipart()[-1], raw=False)
                       if sock.poll(timeout_ms) else None)
    finally:
        sock.close()
        ctx.term()
    return out


def test_relay_keys_decide_what_a_forwarder_may_say(relay_site: RelaySite) -> None:
    site, bob = relay_site, relay_site.bob
    ping = {"msg_type": protocol.PING, "as_uid": bob.uid}
    (api,) = _curve_request(site, API, ping)
    assert api is not None and api["code"] == "permission_denied"
    assert "api relay" in api["error"] and "token" in api["error"]
    (bare,) = _curve_request(site, RELAY, {"msg_type": protocol.PING})
    assert bare is not None and bare["code"] == "protocol" and "no as_uid" in bare["error"]
    (login,) = _curve_request(site, RELAY, ping)
    assert (login["uid"], login["proven"], login["via"]) == (bob.uid, True, f"relay {RELAY}")
    # A key in no allow-list gets no connection at all.
    public, secret = zmq.curve_keypair()
    stray = keys.CurveKeys(public, secret, keys.head_keys(site.live.layout.keys).public)
    assert _curve_request(site, stray, ping, timeout_ms=2000) == [None]
    wait_for(lambda: "refused a relay with an unknown CURVE key" in site.live.log("gqd"),
             "gqd to log the refused key")
    # node1's key is good on the relay endpoint, but only for owners of node1's jobs.
    (node_ping, node_cancel) = _curve_request(
        site, "node1", ping, {"msg_type": protocol.CANCEL, "ids": [1], "as_uid": bob.uid})
    assert (node_ping["uid"], node_ping["proven"], node_ping["via"]) == (
        bob.uid, False, "node node1")
    assert node_cancel["code"] == "permission_denied"
    assert "node node1 speaks only for users with a job running there" in node_cancel["error"]


def test_a_node_relays_for_the_owners_of_its_jobs_only(relay_site: RelaySite) -> None:
    site, alice, bob = relay_site, relay_site.alice, relay_site.bob
    job = site.submit(alice, "-t", "10", "--wrap", 'echo "$GQ_ENDPOINT" > endpoint; sleep 300')
    site.live.wait_state(job, "RUNNING")
    endpoint = wait_for(lambda: (alice.work / "endpoint").exists()
                        and (alice.work / "endpoint").read_text().strip(), "the job's env")
    assert endpoint == site.node_socket()
    hold = ("hold", {"ids": [job], "as_uid": bob.uid})
    alices, bobs = (site.probe(user, endpoint, ("ping", {"as_uid": bob.uid}), hold)
                    for user in (alice, bob))
    assert (alices[0]["uid"], alices[0]["proven"], alices[0]["via"]) == (
        alice.uid, True, "node node1")
    assert not alices[1]["ok"] or alices[1]["errors"], "a running job cannot be held"
    assert (bobs[0]["uid"], bobs[0]["proven"]) == (bob.uid, False)
    assert bobs[1]["code"] == "permission_denied" and "node node1" in bobs[1]["error"]
    # Through its node alice may act on her own jobs while one holds an allocation there.
    (cancel,) = site.probe(alice, endpoint, ("cancel", {"ids": [job]}))
    assert cancel["ok"] and cancel["cancelled"] == [job], cancel
    assert f"cancel by {alice.name} (uid {alice.uid}) via node node1" in site.live.log("gqd")
    site.live.wait_state(job, "CANCELLED")
    wait_for(lambda: site.live.settled("node1"), "node1 to release the job")
    (after,) = site.probe(alice, endpoint, ("submit", {"jobs": []}))
    assert after["code"] == "permission_denied", "her job there has ended: no more vouching"


def test_a_relay_without_a_connection_to_gqd_says_so_at_once(relay_site: RelaySite,
                                                           top: Path) -> None:  # noqa: F811
    site = relay_site
    tmp_path = top / "unconnected"
    tmp_path.mkdir()
    cfg = site.live.config()
    cfg.relay.head = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    cfg.relay.socket = f"ipc://{tmp_path / 'relay.sock'}"
    path = tmp_path / "gq.toml"
    path.write_text(config_mod.to_toml(cfg))
    with (tmp_path / "relay.log").open("ab") as log:
        relay = subprocess.Popen([sys.executable, "-m", "gq.relay", "--config", str(path),
                                  "--name", RELAY], stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=log)
    try:
        wait_for(lambda: (tmp_path / "relay.sock").exists(), "the relay's socket")
        (reply,) = site.probe(site.alice, cfg.relay.socket, ("ping", {}))
        assert reply is not None and reply["code"] == "unreachable", reply
        assert "not connected to gqd" in reply["error"]
    finally:
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=DEADLINE_S) == 0
    assert not (tmp_path / "relay.sock").exists(), "the relay removes its socket"
