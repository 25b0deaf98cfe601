"""Live clusters for integration tests: real gqd and gqnode processes, real sockets, real SQLite.

Only the GPUs are fake. Each test gets its own personal cluster under tmp_path, started with the
real `gq up` and stopped with `gq down`; whatever is left afterwards is killed and reported.
"""

from __future__ import annotations

import contextlib
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
from gq.cluster import Layout, write_config
from gq.model import JobSpec
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

    def configure(self, change: Callable[[config_mod.Config], None]) -> None:
        """Change the config `gq up` will use; call it before the cluster first starts."""
        cfg = write_config(self.layout)
        change(cfg)
        self.layout.config.write_text(config_mod.to_toml(cfg))

    def spec(self, script: str, **kw: Any) -> JobSpec:
        """A job as `gq submit` run in the work directory would send it."""
        return JobSpec(script=script, uid=os.getuid(), gid=os.getgid(), cwd=str(self.work),
                       env={"PATH": os.environ["PATH"]}, **kw)

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

    def run_ended(self, node: str, job_id: int) -> bool:
        """A run of the job on `node` has ended (its shepherd wrote the status), seen or not."""
        from gq.node.shepherd import read_status
        return any(read_status(run) for run in (self.layout.node_dir(node) / "jobs").glob(
            f"{job_id}.*"))

    def acked(self, node: str) -> bool:
        """Every report `node` has sent reached gqd and was acknowledged (its outbox is empty)."""
        return not any((self.layout.node_dir(node) / "outbox").iterdir())

    def settled(self, node: str) -> bool:
        """`node` holds no run and every report of it was acknowledged."""
        return self.acked(node) and not any((self.layout.node_dir(node) / "jobs").iterdir())

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

    def log_tails(self, *names: str, size: int = 2500) -> str:
        """The ends of these daemons' logs, for a failing test to say what each side did."""
        return "\n".join(f"--- {name} log (end)\n{self.log(name)[-size:]}" for name in names)


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


def lingering(root: Path, within_s: float = 10.0) -> list[psutil.Process]:
    """This cluster's processes still there after `within_s`: `gq down` returns once every node
    has reported its jobs gone, which a job's shepherd does a moment before it exits itself."""
    deadline = time.monotonic() + within_s
    while (left := _session_leftovers(root)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def prepare(root: Path) -> LiveCluster:
    """A cluster's directories and environment under `root`, nothing started yet: its config
    can still be changed (`LiveCluster.write_config`) before `gq up` creates one."""
    env = {**os.environ, "XDG_STATE_HOME": str(root / "state"),
           "XDG_RUNTIME_DIR": str(root / "run"), "GQ_TIMEOUT": "20"}
    env.pop("GQ_CONFIG", None)
    work = root / "work"
    work.mkdir()
    return LiveCluster(root=root, env=env, work=work)


@contextlib.contextmanager
def running(live: LiveCluster, nodes: int = 2, fake_gpus: str = "8",
            up_args: tuple[str, ...] = ()) -> Iterator[LiveCluster]:
    """`gq up` on a prepared cluster (with `up_args`: --cpus, --mem, --node ...); `gq down`
    afterwards, and no process may be left over."""
    root = live.root
    try:
        up = live.gq("up", "--nodes", str(nodes), "--fake-gpus", fake_gpus, *up_args)
        assert up.returncode == 0, f"gq up failed: {up.stderr}\n{live.log('gqd')}"
        yield live
    finally:
        live.gq("down", timeout=90)
        leftovers = lingering(root)
        for proc in leftovers:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"


def node_in_netns(live: LiveCluster, netns: str, name: str, addr: str, log: Any,
                  fake_gpus: str = "8") -> subprocess.Popen[bytes]:
    """gqnode `name` of `live`'s cluster started inside network namespace `netns` (a GPU host
    of its own, at `addr`), logging to `log`; the caller stops it."""
    return subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-m", "gq.node.main", "--config",
         str(live.config_path), "--name", name, "--addr", addr, "--fake-gpus", fake_gpus],
        env=live.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LiveCluster]:
    """A running personal cluster: gqd and two gqnodes with 8 fake GPUs each."""
    with running(prepare(tmp_path)) as live:
        yield live
