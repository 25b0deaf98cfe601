"""A personal cluster on this host: gqd and N gqnodes as background processes of the user.

State lives under $XDG_STATE_HOME/gq, sockets under $XDG_RUNTIME_DIR/gq; `up` is idempotent (it
starts whichever daemon is not running) and `down` stops them, cancelling jobs still running.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gq import config as config_mod
from gq import keys
from gq.client import Client
from gq.errors import GqError, RefusedError, UnreachableError
from gq.fsutil import private_dir
from gq.model import parse_iso_time
from gq.pidfile import read_alive

#: How long `up` waits for the daemons to answer, and `down` for them to exit, in seconds.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
#: Drain reason `gq down` leaves on its nodes; `gq up` resumes only nodes drained for it.
DOWN_REASON = "gq down"


@dataclass
class Layout:
    """Where the personal cluster's files are."""

    root: Path
    runtime: Path

    @classmethod
    def default(cls) -> Layout:
        return cls(root=config_mod.personal_dir(), runtime=config_mod.personal_runtime_dir())

    @property
    def config(self) -> Path:
        return config_mod.personal_config_path() if self.root == config_mod.personal_dir() \
            else self.root / "gq.toml"

    @property
    def head_pid(self) -> Path:
        return self.root / "head" / "gqd.pid"

    @property
    def members(self) -> Path:
        return self.root / "cluster.json"

    @property
    def keys(self) -> Path:
        """CURVE key pairs of gqd and the nodes (made by `up`)."""
        return self.root / "keys"

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name

    def node_pid(self, name: str) -> Path:
        return self.node_dir(name) / "gqnode.pid"

    def log(self, daemon: str) -> Path:
        return self.root / "logs" / f"{daemon}.log"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(layout: Layout) -> config_mod.Config:
    """The cluster's config, created on first use (its ports then stay fixed across restarts).
    A config written by an older `gq up` gets the personal settings it lacks (keys, metrics,
    owner), which would otherwise fall back to a system cluster's."""
    if layout.config.exists():
        cfg = config_mod.load(layout.config)
        given = config_mod.read_toml(layout.config)
        missing = [(section, key) for section, key in _PERSONAL
                   if key not in given.get(section, {})]
        if missing:
            personal = _personal(layout)
            for section, key in missing:
                setattr(getattr(cfg, section), key, getattr(getattr(personal, section), key))
            layout.config.write_text(config_mod.to_toml(cfg))
        return cfg
    cfg = config_mod.Config()
    node_ep = f"tcp://127.0.0.1:{_free_port()}"
    cfg.head.state_dir = str(layout.root / "head")
    cfg.head.client_endpoints = [f"ipc://{layout.runtime / 'gqd.sock'}",
                                 f"tcp://127.0.0.1:{_free_port()}"]
    cfg.head.node_endpoint = node_ep
    cfg.node.head = node_ep
    cfg.node.state_dir = str(layout.root / "nodes" / "{name}")
    cfg.auth.admins = [_me()]
    personal = _personal(layout)
    for section, key in _PERSONAL:
        setattr(getattr(cfg, section), key, getattr(getattr(personal, section), key))
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.config.write_text(config_mod.to_toml(cfg))
    cfg.path = str(layout.config)
    return cfg


#: Settings in which a personal cluster differs from a system one, beyond its paths and ports.
_PERSONAL = (("head", "metrics_addr"), ("head", "relay_endpoint"), ("auth", "owner"),
             ("auth", "allow_root_jobs"), ("auth", "key_dir"), ("node", "cgroup_root"))


def _personal(layout: Layout) -> config_mod.Config:
    cfg = config_mod.Config()
    # Any free port, so that several users' clusters on one host never clash; gqd writes the one
    # it got to its state directory.
    cfg.head.metrics_addr = "127.0.0.1:0"
    # Its users are on this host, on the ipc socket: no login host relays for them.
    cfg.head.relay_endpoint = ""
    # Only the owner may talk to it (the kernel's uid), and its jobs run as the owner anyway:
    # root's personal cluster runs root's jobs.
    cfg.auth.owner = _me()
    cfg.auth.allow_root_jobs = os.getuid() == 0
    cfg.auth.key_dir = str(layout.keys)
    # Its jobs' cgroups under gqnode's own, in a subtree of this cluster's alone: several
    # personal clusters on a host (all with a node1) never touch each other's jobs.
    cfg.node.cgroup_root = "gq-" + hashlib.sha1(str(layout.root).encode()).hexdigest()[:10]
    return cfg


def metrics_url(cfg: config_mod.Config) -> str | None:
    """Where the running gqd of `cfg` serves Prometheus metrics (None: it serves none)."""
    from gq.head.metrics import ADDR_FILE
    try:
        addr = (Path(cfg.head.state_dir) / ADDR_FILE).read_text().strip()
    except OSError:
        return None
    return f"http://{addr}/metrics" if addr else None


def _me() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _spawn(args: list[str], log: Path) -> None:
    """Start a daemon in the background, its output to `log`; under umask 0077 from the start
    (the daemons set it themselves too), so that nothing of it is readable by other users."""
    private_dir(log.parent, 0o700)
    with open(os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600),
              "ab") as out:
        subprocess.Popen([sys.executable, "-m", *args], stdin=subprocess.DEVNULL, stdout=out,
                         stderr=out, start_new_session=True, close_fds=True, umask=0o077)


def up(nodes: int | None, fake_gpus: str | None, layout: Layout | None = None,
       say: Callable[[str], None] = lambda _: None, shape: dict[str, str] | None = None,
       named: list[dict[str, str]] | None = None) -> config_mod.Config:
    """Start whatever part of the personal cluster is not running; wait until it serves.
    `shape`: what every node claims to have (cpus, mem, features: gqnode's --cpus, --mem,
    --features); `named`: the nodes one by one instead (name, and any of fake_gpus, cpus,
    mem, features), see `parse_node`."""
    layout = layout or Layout.default()
    layout.runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(layout.runtime, 0o700)  # only the owner may reach the sockets
    cfg = write_config(layout)
    members = _members(layout, nodes, fake_gpus, say, shape or {}, named)
    if cfg.auth.curve:
        keys.ensure(Path(cfg.auth.key_dir), [keys.HEAD, *(m["name"] for m in members)])
    if read_alive(layout.head_pid) is None:
        _spawn(["gq.head.daemon", "--config", str(layout.config)], layout.log("gqd"))
        say("started gqd")
    client = Client(_wait_for_socket(cfg, layout), timeout_s=5.0)
    _until(lambda: _answers(client), "gqd to answer", layout.log("gqd"))
    started_at = time.time()
    started = []
    for member in members:
        if read_alive(layout.node_pid(member["name"])) is None:
            fake = ["--fake-gpus", member["fake_gpus"]] if member["fake_gpus"] else []
            claims = [w for key in NODE_KEYS if member.get(key)
                      for w in (f"--{key}", member[key])]
            _spawn(["gq.node.main", "--config", str(layout.config), "--name", member["name"],
                    "--addr", "127.0.0.1", *fake, *claims], layout.log(member["name"]))
            started.append(member["name"])
            say(f"started gqnode {member['name']} "
                f"({member['fake_gpus'] + ' fake' if fake else 'real'} GPUs)")
    for name in started:
        _until(lambda: read_alive(layout.node_pid(name)) is not None,
               f"gqnode {name} to start", layout.log(name))
    _until(lambda: _registered(client, {m["name"] for m in members}, set(started), started_at),
           "the nodes to register", layout.log(members[0]["name"]) if members else None)
    downed = [n["name"] for n in client.nodes()
              if n["state"] == "DRAIN" and n["reason"] == DOWN_REASON]
    if downed:
        client.resume(downed)
    client.close()
    return cfg


#: What a node of `gq up` may claim besides its GPUs (gqnode's options of these names).
NODE_KEYS = ("cpus", "mem", "features")


def parse_node(text: str) -> dict[str, str]:
    """`gq up --node NAME[:cpus=N,mem=SIZE,gpus=SPEC,features=A+B]` as a member."""
    from gq.errors import UsageError
    name, _, rest = text.partition(":")
    member = {"name": name.strip()}
    if not member["name"] or not all(c.isalnum() or c in "-_." for c in member["name"]):
        raise UsageError(f"bad --node {text!r}: expected NAME[:cpus=N,mem=SIZE,gpus=SPEC,"
                         "features=A+B]")
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = {"gpus": "fake_gpus"}.get(key.strip(), key.strip())
        if not eq or key not in ("fake_gpus", *NODE_KEYS):
            raise UsageError(f"bad --node {text!r}: {item!r}: expected cpus=, mem=, gpus= or "
                             "features=")
        member[key] = value.strip().replace("+", ",") if key == "features" else value.strip()
    return member


def _members(layout: Layout, nodes: int | None, fake_gpus: str | None,
             say: Callable[[str], None], shape: dict[str, str],
             named: list[dict[str, str]] | None) -> list[dict[str, str]]:
    """The cluster's nodes: as recorded, changed by what this `up` asked for."""
    recorded = json.loads(layout.members.read_text()) if layout.members.exists() else []
    count = len(named) if named else nodes if nodes is not None else (len(recorded) or 1)
    spec = fake_gpus if fake_gpus is not None else (
        recorded[0]["fake_gpus"] if recorded else _default_gpus(say))
    if not spec and count > 1 and not all(m.get("fake_gpus") for m in named or ()):
        say("real GPUs can belong to only one node on this host: starting 1 node, not "
            f"{count} (use --fake-gpus to simulate more)")
        count = 1
    kept = {k: v for k, v in (recorded[0] if recorded and not shape and not named else {}).items()
            if k in NODE_KEYS}
    members = [{"name": f"node{i + 1}", "fake_gpus": spec, **kept, **shape}
               for i in range(count)]
    if named:
        members = [{"fake_gpus": spec, **shape, **m} for m in named[:count]]
    layout.members.write_text(json.dumps(members))
    return members


def _default_gpus(say: Callable[[str], None]) -> str:
    """'' (use NVML) when this host has GPUs, else 8 fake GPUs per node."""
    from gq.node.gpus import open_gpus
    source = open_gpus(None)
    try:
        found = len(source.discover())
    finally:
        source.close()
    if found:
        say(f"NVML finds {found} GPU(s) here: the node uses them")
        return ""
    say("no GPU found through NVML: each node gets 8 fake GPUs (--fake-gpus to choose)")
    return "8"


def _registered(client: Client, names: set[str], fresh: set[str], since: float) -> bool:
    """Every node is up, and those just started have registered since `since`."""
    seen = {n["name"]: n for n in client.nodes() if n["state"] != "DOWN"}
    return names <= seen.keys() and all(
        (parse_iso_time(seen[n]["last_seen"]) or 0) >= int(since) for n in fresh)


def _wait_for_socket(cfg: config_mod.Config, layout: Layout) -> config_mod.Config:
    ipc = cfg.head.client_endpoints[0][len("ipc://"):]
    _until(lambda: Path(ipc).exists(), "gqd's socket", layout.log("gqd"))
    return cfg


def _answers(client: Client) -> bool:
    try:
        client.ping()
        return True
    except UnreachableError:
        return False


def _until(check: Callable[[], bool], what: str, log: Path | None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    tail = ""
    if log and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    raise GqError(f"timed out after {START_TIMEOUT_S:.0f}s waiting for {what}; log {log}:{tail}")


def down(layout: Layout | None = None, say: Callable[[str], None] = lambda _: None) -> None:
    """Cancel running jobs (their processes must not outlive the cluster), then stop daemons."""
    layout = layout or Layout.default()
    if layout.config.exists() and read_alive(layout.head_pid) is not None:
        _cancel_running(config_mod.load(layout.config), say)
    pids = [read_alive(p) for p in sorted((layout.root / "nodes").glob("*/gqnode.pid"))]
    _stop([p for p in pids if p], "gqnode", say)
    head = read_alive(layout.head_pid)
    _stop([head] if head else [], "gqd", say)


def _cancel_running(cfg: config_mod.Config, say: Callable[[str], None]) -> None:
    try:
        with Client(cfg, timeout_s=5.0) as client:
            # Drain first: GPUs freed by the cancels must not start pending jobs as we go.
            names = [n["name"] for n in client.nodes() if n["state"] == "UP"]
            if names:
                client.drain(names, DOWN_REASON)
            running = [j["id"] for j in client.queue(states=["RUNNING"])]
            if running:
                client.cancel(running)
                say(f"cancelled {len(running)} running job(s); pending jobs stay queued")
            # Wait even when this call cancelled nothing: a job cancelled just before `down`
            # is CANCELLED already, but its processes live until its node reports them gone,
            # and stopping gqnode first would leave them running. (A DOWN node reports nothing.)
            deadline = time.monotonic() + cfg.head.kill_grace_s + STOP_TIMEOUT_S
            while time.monotonic() < deadline and any(
                    n.get("jobs") and n["state"] != "DOWN" for n in client.nodes()):
                time.sleep(0.1)
    except (UnreachableError, RefusedError) as exc:
        say(f"could not cancel running jobs: {exc}")


def _stop(pids: list[int], what: str, say: Callable[[str], None]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + STOP_TIMEOUT_S
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _exists(p)]
        time.sleep(0.05)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    if pids:
        say(f"stopped {len(pids)} {what}")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own child, in tests) has exited for all purposes here.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False
