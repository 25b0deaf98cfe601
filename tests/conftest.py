"""Live clusters for integration tests: real gqd and gqnode processes, real sockets, real SQLite.

Only the GPUs are fake. Each test gets its own personal cluster under tmp_path, started with the
real `gq up` and stopped with `gq down`; whatever is left afterwards is killed and reported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from gq import config as config_mod
from gq.cluster import Layout
from gq.pidfile import read_alive

#: Upper bound for a condition a test waits for; generous because CI machines are slow and shared.
DEADLINE_S = 60.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = DEADLINE_S,
             every: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; fail the test naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@dataclass
class LiveCluster:
    root: Path
    env: dict[str, str]
    work: Path

    @property
    def layout(self) -> Layout:
        """Where `gq up` put this cluster's files (the env's XDG directories)."""
        return Layout(root=self.root / "state" / "gq", runtime=self.root / "run" / "gq")

    @property
    def config_path(self) -> Path:
        return self.layout.config

    def config(self) -> config_mod.Config:
        return config_mod.load(self.config_path)

    def gq(self, *args: str, check: bool = False, timeout: float = DEADLINE_S,
           input: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run the real `gq` CLI in a subprocess, as a user would."""
        proc = subprocess.run([sys.executable, "-m", "gq.cli.main", *args], env=self.env,
                              cwd=cwd or self.work, capture_output=True, text=True,
                              timeout=timeout, input=input)
        if check and proc.returncode != 0:
            pytest.fail(f"gq {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def submit(self, *args: str) -> int:
        return int(self.gq("submit", "--parsable", *args, check=True).stdout.strip())

    def client(self):  # noqa: ANN201
        from gq.client import Client
        return Client(self.config())

    def show(self, job_id: int) -> dict[str, Any]:
        with self.client() as c:
            return c.show(job_id)

    def nodes(self) -> list[dict[str, Any]]:
        with self.client() as c:
            return c.nodes()

    def wait_state(self, job_id: int, *states: str, timeout: float = DEADLINE_S) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job = self.show(job_id)
            return job if job["state"] in states else None
        return wait_for(check, f"job {job_id} to be {'/'.join(states)}", timeout)

    def head_pid(self) -> int | None:
        return read_alive(self.layout.head_pid)

    def node_pid(self, name: str) -> int | None:
        return read_alive(self.layout.node_pid(name))

    def reconfigure(self, toml: str) -> None:
        """Add config sections and have gqd reload them (SIGHUP), as a sysadmin would."""
        before = self.log("gqd").count("configuration reloaded")
        with open(self.config_path, "a") as f:
            f.write("\n" + toml + "\n")
        os.kill(self.head_pid(), signal.SIGHUP)
        wait_for(lambda: self.log("gqd").count("configuration reloaded") > before,
                 "gqd to reload its configuration")

    def log(self, name: str) -> str:
        path = self.layout.log(name)
        return path.read_text(errors="replace") if path.exists() else ""


def _session_leftovers(root: Path) -> list[psutil.Process]:
    """Processes started for this cluster (their command line or cwd mentions its directory)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "environ"]):
        try:
            env = proc.info.get("environ") or {}
            mine = env.get("XDG_STATE_HOME", "").startswith(str(root)) \
                or str(root) in " ".join(proc.info["cmdline"] or [])
            if mine and proc.pid != os.getpid():
                found.append(proc)
        except (psutil.Error, TypeError):
            continue
    return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LiveCluster]:
    """A running personal cluster: gqd and two gqnodes with 8 fake GPUs each."""
    root = tmp_path
    env = {**os.environ, "XDG_STATE_HOME": str(root / "state"),
           "XDG_RUNTIME_DIR": str(root / "run"), "GQ_TIMEOUT": "20"}
    env.pop("GQ_CONFIG", None)
    work = root / "work"
    work.mkdir()
    live = LiveCluster(root=root, env=env, work=work)
    up = live.gq("up", "--nodes", "2", "--fake-gpus", "8")
    assert up.returncode == 0, f"gq up failed: {up.stderr}\n{live.log('gqd')}"
    try:
        yield live
    finally:
        live.gq("down", timeout=90)
        leftovers = _session_leftovers(root)
        for proc in leftovers:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"
