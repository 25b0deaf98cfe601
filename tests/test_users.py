"""Many users on one cluster: real Unix users (useradd; CI runs as root) use the real CLI over the
ipc socket, and gqd knows them by the kernel's word, not by what their messages claim.

The cluster is a "system" one: its socket and files sit in a 0755 directory under /tmp, every
user may connect, and root's jobs are refused. gqnode runs as root and starts each job as its owner.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gq import config as config_mod
from tests.conftest import LiveCluster, prepare, running, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create the test users (CI runs as root)")

#: Runs the real CLI (or a raw-socket probe) as another user: gq and what it imports lazily are
#: loaded first, then the process drops to the user's uid, gid and groups. (This interpreter
#: may live under root's 0700 home, out of the user's reach, so `runuser python` cannot work.)
AS_USER = r"""
import os, sys
import msgpack, zmq
import gq.cli.main as cli, gq.cli.app, gq.cli.fast, gq.client, gq.cli.render, gq.protocol
import gq.arrays, gq.deps, gq.storecopy, gq.store
gq.cli.app.register()
uid, gid, groups, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.setgroups([int(g) for g in groups.split(",") if g])
os.setgid(gid)
os.setuid(uid)
if mode == "cli":
    sys.exit(cli.main(sys.argv[5:]))
# mode "claim": ask gqd over the ipc socket while claiming to be root in the message itself.
endpoint, victim = sys.argv[5], int(sys.argv[6])
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.linger = 0
sock.connect(endpoint)
for rid, (kind, fields) in enumerate([("ping", {}), ("cancel", {"ids": [victim]})], 1):
    sock.send(gq.protocol.encode(kind, rid=rid, claim_uid=0, claim_user="root", **fields))
    assert sock.poll(20_000), "no reply"
    print(msgpack.unpackb(sock.recv(), raw=False))
"""


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path
    #: A 0755 directory of theirs where their jobs run and write.
    work: Path

    @property
    def groups(self) -> list[int]:
        return os.getgrouplist(self.name, self.gid)


@dataclass
class Site:
    live: LiveCluster
    alice: User
    bob: User
    #: An admin by name in [auth] admins, not root.
    carol: User
    #: A supplementary group of alice's.
    group: str

    def gq(self, user: User, *args: str) -> subprocess.CompletedProcess[str]:
        return self.as_user(user, "cli", *args)

    def as_user(self, user: User, mode: str, *args: str) -> subprocess.CompletedProcess[str]:
        groups = ",".join(map(str, user.groups))
        env = {**self.live.env, "GQ_CONFIG": str(self.live.config_path), "HOME": str(user.home),
               "USER": user.name, "LOGNAME": user.name}
        return subprocess.run(
            [sys.executable, "-c", AS_USER, str(user.uid), str(user.gid), groups, mode, *args],
            env=env, cwd=user.work, capture_output=True, text=True, timeout=60)

    def submit(self, user: User, *args: str) -> int:
        proc = self.gq(user, "submit", "--parsable", *args)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.strip())


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def top() -> Iterator[Path]:
    """A 0755 directory under /tmp that every test user can reach (pytest's are root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gq-users-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def users(top: Path) -> Iterator[dict[str, User]]:
    tag = os.getpid() % 100_000
    group = f"gqg{tag}"
    names = {"alice": f"gqa{tag}", "bob": f"gqb{tag}", "carol": f"gqc{tag}"}
    made: list[str] = []
    try:
        _run("groupadd", group)
        for role, name in names.items():
            extra = ["-G", group] if role == "alice" else []
            _run("useradd", "-m", "-s", "/bin/sh", *extra, name)
            made.append(name)
        out = {}
        for role, name in names.items():
            pw = pwd.getpwnam(name)
            home = Path(pw.pw_dir)
            home.chmod(0o700)
            work = top / role
            work.mkdir()
            os.chown(work, pw.pw_uid, pw.pw_gid)
            out[role] = User(name, pw.pw_uid, pw.pw_gid, home, work)
        out["group"] = group  # type: ignore[assignment]
        yield out
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture(scope="module")
def site(top: Path, users: dict[str, User]) -> Iterator[Site]:
    (top / "cluster").mkdir()
    live = prepare(top / "cluster")
    live.configure(system(top, users))
    with running(live, nodes=1, fake_gpus="4") as live:
        yield Site(live, users["alice"], users["bob"], users["carol"],
                   users["group"])  # type: ignore[arg-type]


def system(top: Path, users: dict[str, User]) -> Callable[[config_mod.Config], None]:
    """A system cluster's settings: its socket in a 0755 directory under `top`, every user may
    connect, root's jobs are refused, carol is an admin."""
    def shared(cfg: config_mod.Config) -> None:
        cfg.head.client_endpoints = [f"ipc://{top / 'run' / 'gqd.sock'}"]
        cfg.auth.owner = ""  # a system cluster: everyone may connect
        cfg.auth.allow_root_jobs = False
        cfg.auth.admins = ["root", users["carol"].name]
    return shared


def _state(site: Site, job_id: int, *states: str) -> dict:
    return site.live.wait_state(job_id, *states)


def test_a_user_cannot_cancel_hold_or_requeue_another_users_job_but_an_admin_can(
        site: Site) -> None:
    bobs = site.submit(site.bob, "-t", "10", "--wrap", "sleep 300")
    _state(site, bobs, "RUNNING")
    actions = ["cancel", "hold", "requeue"]
    for action in actions:
        proc = site.gq(site.alice, action, str(bobs))
        assert proc.returncode == 1, (action, proc.stdout, proc.stderr)
        assert "permission denied" in proc.stderr and site.bob.name in proc.stderr, proc.stderr
    assert site.live.show(bobs)["state"] == "RUNNING"
    proc = site.gq(site.carol, "cancel", str(bobs))
    assert proc.returncode == 0, proc.stderr
    _state(site, bobs, "CANCELLED")


def test_a_job_runs_with_its_owners_uid_gid_and_groups_and_writes_as_them(site: Site) -> None:
    alice = site.alice
    job = site.submit(alice, "-o", "id.out", "--wrap",
                      'id -u; id -g; id -G; echo "$USER $LOGNAME $HOME"; umask')
    assert _state(site, job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    out = alice.work / "id.out"
    uid, gid, groups, names, umask = out.read_text().splitlines()
    assert (int(uid), int(gid)) == (alice.uid, alice.gid)
    assert set(map(int, groups.split())) == set(alice.groups)
    assert grp.getgrnam(site.group).gr_gid in set(map(int, groups.split()))
    assert 0 not in set(map(int, groups.split())), "the job kept root's group"
    assert names == f"{alice.name} {alice.name} {alice.home}"
    assert umask == "0022"
    assert (out.stat().st_uid, out.stat().st_gid) == (alice.uid, alice.gid)


def test_output_into_another_users_private_home_fails_and_gqnode_carries_on(site: Site) -> None:
    target = site.bob.home / "stolen.out"
    job = site.submit(site.alice, "-o", str(target), "--wrap", "echo written")
    ended = _state(site, job, "COMPLETED", "FAILED")
    assert ended["state"] == "FAILED"
    assert "Permission denied" in ended["reason"] and str(target) in ended["reason"]
    assert not target.exists()
    assert site.live.node_pid("node1") is not None
    assert [n["state"] for n in site.live.nodes()] == ["UP"]
    after = site.submit(site.alice, "--wrap", "true")
    assert _state(site, after, "COMPLETED", "FAILED")["state"] == "COMPLETED"


def test_a_claim_inside_the_message_does_not_change_who_the_kernel_says_is_calling(
        site: Site) -> None:
    bobs = site.submit(site.bob, "-t", "10", "--wrap", "sleep 300")
    endpoint = site.live.config().head.client_endpoints[0]
    proc = site.as_user(site.alice, "claim", endpoint, str(bobs))
    assert proc.returncode == 0, proc.stderr
    ping, cancel = (eval(line) for line in proc.stdout.splitlines())  # noqa: S307 - our repr
    assert (ping["user"], ping["uid"], ping["proven"]) == (site.alice.name, site.alice.uid, True)
    assert cancel["cancelled"] == [] and "permission denied" in cancel["errors"][str(bobs)]
    assert site.live.show(bobs)["state"] in ("PENDING", "RUNNING")
    site.live.gq("cancel", str(bobs), check=True)  # root is an admin


def test_jobs_of_root_are_refused_on_a_system_cluster(site: Site) -> None:
    proc = site.live.gq("submit", "--wrap", "true")
    assert proc.returncode == 1
    assert "permission denied" in proc.stderr and "allow_root_jobs" in proc.stderr


def test_a_personal_cluster_admits_only_its_owner(top: Path, users: dict[str, User]) -> None:
    (top / "personal").mkdir()
    live = prepare(top / "personal")
    live.configure(lambda cfg: setattr(cfg.head, "client_endpoints",
                                       [f"ipc://{top / 'personal-run' / 'gqd.sock'}"]))
    with running(live, nodes=1, fake_gpus="1") as live:
        assert live.config().auth.owner == "root"
        site = Site(live, users["alice"], users["bob"], users["carol"], "")
        proc = site.gq(site.alice, "queue")
        assert proc.returncode == 3, proc.stderr  # never admitted: as if no head were there
        wait_for(lambda: f"refused a client of uid {site.alice.uid}" in live.log("gqd"),
                 "gqd to log the refusal")
        assert live.gq("queue").returncode == 0


def test_gq_update_an_owner_may_lower_and_step_down_an_admin_may_raise(site: Site) -> None:
    alice, bob, carol = site.alice, site.bob, site.carol
    job = site.submit(alice, "--hold", "-t", "1h", "--wrap", "true")

    def refused(user: User, *args: str) -> str:
        proc = site.gq(user, "update", str(job), *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "permission denied" in proc.stderr, proc.stderr
        return proc.stderr

    assert site.gq(alice, "update", str(job), "--time", "30m", "-J", "mine").returncode == 0
    assert "raise a time limit" in refused(alice, "--time", "2h")
    assert "UNLIMITED" in refused(alice, "--time", "UNLIMITED")
    assert "higher priority" in refused(alice, "--qos", "pro")
    assert site.gq(alice, "update", str(job), "--qos", "free").returncode == 0
    assert "higher priority" in refused(alice, "--qos", "normal")  # no way back up
    assert alice.name in refused(bob, "--name", "stolen")
    after = site.live.show(job)
    assert (after["time_limit_s"], after["qos"], after["name"]) == (1800, "free", "mine")
    # An admin (carol, by name in [auth] admins) may raise the limit and the QOS.
    assert site.gq(carol, "update", str(job), "--time", "4h", "--qos", "pro").returncode == 0
    after = site.live.show(job)
    assert (after["time_limit_s"], after["qos"]) == (4 * 3600, "pro")
    assert site.gq(alice, "cancel", str(job)).returncode == 0


def _files(*dirs: Path) -> list[Path]:
    return [p for d in dirs for p in d.rglob("*") if p.is_file()]


def test_another_user_reads_nothing_of_a_jobs_secret_from_disk(site: Site) -> None:
    alice, bob, live = site.alice, site.bob, site.live
    secret = f"s3cret-{os.urandom(8).hex()}"
    (alice.work / "release").unlink(missing_ok=True)
    job = site.submit(alice, "-o", "secret.out", "--export", f"ALL,GQ_TEST_SECRET={secret}",
                      "--wrap", 'printf %s "$GQ_TEST_SECRET" | sha256sum; '
                                'while [ ! -e release ]; do sleep 0.1; done')
    _state(site, job, "RUNNING")
    head_dir, node_dir = Path(live.config().head.state_dir), live.layout.node_dir("node1")
    run_dir = node_dir / "jobs" / f"{job}.0"
    wait_for(lambda: (run_dir / "run").exists(), "the run's record")
    # The secret is on disk (root finds it: in the database and in the run's order)...
    holding = [p for p in _files(head_dir, node_dir) if secret.encode() in p.read_bytes()]
    assert run_dir / "launch.msg" in holding
    assert any(p.parent == head_dir and p.name.startswith("gq.db") for p in holding), holding
    # ...and bob reads none of it: he cannot list the state directories nor open their files.
    grep = subprocess.run(["grep", "-r", "-l", "-a", secret, str(head_dir), str(node_dir)],
                          user=bob.uid, group=bob.gid, extra_groups=bob.groups,
                          capture_output=True, text=True, timeout=60)
    assert grep.returncode == 2 and grep.stdout == "", (grep.stdout, grep.stderr)
    assert "Permission denied" in grep.stderr, grep.stderr
    for path in holding:
        cat = subprocess.run(["cat", str(path)], user=bob.uid, group=bob.gid,
                             extra_groups=bob.groups, capture_output=True, timeout=60)
        assert cat.returncode != 0 and secret.encode() not in cat.stdout, path
        assert b"Permission denied" in cat.stderr, (path, cat.stderr)
    # Nor can he copy the database with gq admin backup: it reads the file, with his rights.
    backup = site.gq(bob, "admin", "backup", str(bob.work / "stolen.db"))
    assert backup.returncode == 1 and "run gq admin backup as that user" in backup.stderr, \
        backup.stderr
    assert not (bob.work / "stolen.db").exists()
    # The modes that do it: private directories (0711 where a job's owner passes through to
    # its run directory), files 0600, the run directory and its script the owner's.
    modes = {p: p.stat().st_mode & 0o777 for p in (head_dir, node_dir, node_dir / "jobs",
                                                   node_dir / "outbox", run_dir)}
    assert modes == {head_dir: 0o700, node_dir: 0o711, node_dir / "jobs": 0o711,
                     node_dir / "outbox": 0o700, run_dir: 0o700}, modes
    for path in [*head_dir.glob("gq.db*"), run_dir / "launch.msg", run_dir / "run",
                 *(node_dir / "outbox").iterdir()]:
        assert path.stat().st_mode & 0o777 == 0o600, (path, oct(path.stat().st_mode))
    assert (run_dir.stat().st_uid, (run_dir / "script").stat().st_uid) == (alice.uid, alice.uid)
    assert (run_dir / "script").stat().st_mode & 0o777 == 0o700
    # The job itself ran as alice with its environment.
    (alice.work / "release").touch()
    assert _state(site, job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    out = alice.work / "secret.out"
    assert out.read_text().split()[0] == digest and out.stat().st_uid == alice.uid
