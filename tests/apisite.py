"""A live cluster with `gq api` in front of it, for the tests of the HTTP API: real gqd, gqnode
and gq api processes, the API's relay key in gqd's key_dir/relays/ (kind api), HTTP over
loopback with httpx."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from gq import config as config_mod
from gq import keys
from tests.conftest import DEADLINE_S, LiveCluster, running, wait_for

API = "api1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ApiSite:
    live: LiveCluster
    url: str
    proc: subprocess.Popen[bytes]

    def http(self, token: str | None = None, timeout: float = DEADLINE_S) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def token(self, **fields: Any) -> str:
        """A token made over gqd's ipc socket, as `gq token create` makes one."""
        with self.live.client() as c:
            return str(c.token_create(**fields)["token"])

    def spec(self, command: str, **fields: Any) -> dict[str, Any]:
        """A JobSpec of the API running `command` in the cluster's work directory."""
        import os
        return {"wrap": command, "cwd": str(self.live.work), "gpus": 1,
                "env": {"PATH": os.environ["PATH"]}, **fields}


def configure(live: LiveCluster, change: Callable[[config_mod.Config], None] | None = None
              ) -> str:
    """Give the cluster a relay endpoint and gq api a key and an address; the API's URL."""
    port = free_port()

    def setup(cfg: config_mod.Config) -> None:
        cfg.head.relay_endpoint = f"tcp://127.0.0.1:{free_port()}"
        cfg.api.listen = f"127.0.0.1:{port}"
        cfg.api.name = API
        if change is not None:
            change(cfg)
    live.configure(setup)
    keys.ensure(live.layout.keys, [keys.HEAD])
    keys.keygen(live.layout.keys, API, relay=keys.API, force=True)
    return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def serving(live: LiveCluster, url: str) -> Iterator[ApiSite]:
    """`gq api` for a running cluster, until SIGTERM; its log is the cluster's `api` log."""
    with live.layout.log("api").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gq.api.main", "--config",
                                 str(live.config_path)], env=live.env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log)
    site = ApiSite(live, url, proc)
    try:
        def healthy() -> bool:
            assert proc.poll() is None, f"gq api exited: {live.log('api')}"
            try:
                return httpx.get(f"{url}/v1/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(healthy, "gq api to serve and connect to gqd")
        yield site
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def api_cluster(live: LiveCluster, nodes: int = 1, fake_gpus: str = "4",
                change: Callable[[config_mod.Config], None] | None = None
                ) -> Iterator[ApiSite]:
    url = configure(live, change)
    with running(live, nodes=nodes, fake_gpus=fake_gpus) as live, serving(live, url) as site:
        yield site
