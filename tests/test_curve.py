"""gqnode <-> gqd over CurveZMQ: only allow-listed keys register, a key is bound to its node's
name, and what crosses the wire is not plain text (a recording TCP proxy in between shows it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gq import config as config_mod
from gq import keys
from gq.errors import ConfigError, UsageError
from tests.conftest import LiveCluster, prepare, running, wait_for

MARKER = "gq-secret-marker-4711"


def _node_state(live: LiveCluster, name: str) -> str | None:
    return next((n["state"] for n in live.nodes() if n["name"] == name), None)


def _gqnode(live: LiveCluster, config: Path, name: str, state_dir: Path) -> subprocess.Popen:
    with open(live.root / f"{state_dir.name}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gq.node.main", "--config", str(config), "--name", name,
             "--state-dir", str(state_dir), "--fake-gpus", "2"],
            env=live.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def test_unknown_key_cannot_register_a_key_cannot_pose_as_another_node_a_valid_one_can(
        cluster: LiveCluster, tmp_path: Path) -> None:
    # A node with a key pair gqd has never seen (it knows gqd's public key, as anyone may).
    rogue = tmp_path / "rogue-keys"
    rogue.mkdir()
    shutil.copy(cluster.layout.keys / "gqd.key", rogue / "gqd.key")
    keys.keygen(rogue, "node9")
    cfg = cluster.config()
    cfg.auth.key_dir = str(rogue)
    rogue_config = tmp_path / "rogue.toml"
    rogue_config.write_text(config_mod.to_toml(cfg))
    node = _gqnode(cluster, rogue_config, "node9", tmp_path / "node9-rogue")
    try:
        wait_for(lambda: "refused a node with an unknown CURVE key" in cluster.log("gqd"),
                 "gqd to refuse the unknown key")
        assert _node_state(cluster, "node9") is None
    finally:
        _stop(node)
    # node2's (valid) key, presented by a node calling itself node1.
    shutil.copy(cluster.layout.keys / "node2.key_secret", rogue / "node1.key_secret")
    node = _gqnode(cluster, rogue_config, "node1", tmp_path / "node1-impostor")
    try:
        wait_for(lambda: "calling itself 'node1': its key belongs to node 'node2'"
                 in cluster.log("gqd"), "gqd to refuse the impostor")
    finally:
        _stop(node)
    # Allow-listed by the admin (no gqd restart): the same name now registers.
    keys.keygen(cluster.layout.keys, "node9")
    node = _gqnode(cluster, cluster.config_path, "node9", tmp_path / "node9-valid")
    try:
        wait_for(lambda: _node_state(cluster, "node9") == "UP", "node9 to register")
        job = cluster.submit("-g", "2", "--wrap", "true")
        assert cluster.wait_state(job, "COMPLETED")["state"] == "COMPLETED"
    finally:
        _stop(node)


class RecordingProxy:
    """Forwards TCP connections to `target`, keeping every byte that passes, both ways."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.seen = bytearray()
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                # Closed here, not left to the garbage collector: its ResourceWarning would fail
                # whichever later test happens to be running then.
                s.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxied(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LiveCluster,
                                                                             RecordingProxy]]:
    """A cluster whose nodes reach gqd only through a RecordingProxy; curve on or off."""
    live = prepare(tmp_path)
    holder: list[RecordingProxy] = []

    def through_proxy(cfg: config_mod.Config) -> None:
        port = int(cfg.head.node_endpoint.rsplit(":", 1)[1])
        proxy = RecordingProxy(("127.0.0.1", port))
        holder.append(proxy)
        cfg.node.head = f"tcp://127.0.0.1:{proxy.port}"
        cfg.auth.curve = request.param

    live.configure(through_proxy)
    try:
        with running(live, nodes=1, fake_gpus="1") as live:
            yield live, holder[0]
    finally:
        holder[0].close()


@pytest.mark.parametrize("proxied", [True, False], ids=["curve", "plain"], indirect=True)
def test_node_traffic_shows_no_job_command_on_the_wire(
        proxied: tuple[LiveCluster, RecordingProxy]) -> None:
    live, proxy = proxied
    job = live.submit("--wrap", f"echo {MARKER}")
    assert live.wait_state(job, "COMPLETED")["state"] == "COMPLETED"
    assert (live.work / f"gq-{job}.out").read_text().strip() == MARKER
    curve = live.config().auth.curve
    with proxy._lock:
        seen = bytes(proxy.seen)
    assert len(seen) > 1000, "the proxy saw no traffic"
    # Plain text shows the command (so the recording works); CURVE must not.
    assert (MARKER.encode() in seen) is not curve
    assert (b"launch" in seen) is not curve


def test_keygen_writes_secrets_0600_whatever_the_umask_and_refuses_readable_ones(
        tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        written = keys.keygen(tmp_path, "node7")
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in written}
    assert modes == {"node7.key": 0o644, "node7.key_secret": 0o600, "nodes/node7.key": 0o644}
    assert keys.allowed_nodes(tmp_path) == {keys.load_public(tmp_path / "node7.key"): "node7"}
    (tmp_path / "node7.key_secret").chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        keys.load_secret(tmp_path / "node7.key_secret")
    with pytest.raises(UsageError, match="exists"):
        keys.keygen(tmp_path, "node7")
