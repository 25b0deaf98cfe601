"""A lab cluster in network namespaces, installed by following docs/INSTALL.md literally (issue 16,
Done when 1 and 3): a head, two GPU hosts and a login host, each in its own network namespace,
joined by a bridge in the head's; two real Unix users (useradd) who work from the login host.

The test runs the page's `lab=ROLE` blocks, in order, each on the hosts of its role, not
commands of its own. The hosts share this machine's file system, so each gets its own
directories through the page's variables (GQ_ETC, GQ_STATE, GQ_RUN; gq itself goes to a
temporary PREFIX and BINDIR, so nothing lands in /opt or /usr/local), and `scp HOST:PATH`
copies the head host's PATH. CI runs as root; elsewhere the test is skipped.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from gq import config as config_mod
from gq.client import Client
from tests.conftest import wait_for
from tests.test_users import User

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None
                       or shutil.which("useradd") is None or shutil.which("setpriv") is None,
                       reason="needs root, iproute2, useradd and setpriv (CI runs as root)"),
    # The install (a venv and its dependencies) takes a minute on a loaded machine.
    pytest.mark.timeout(900),
]

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "docs" / "INSTALL.md"
BLOCK = re.compile(r"^```sh lab=([\w-]+)\n(.*?)^```$", re.M | re.S)
#: The lab's hosts: name -> role.
HOSTS = {"head": "head", "gpu01": "gpu", "gpu02": "gpu", "login1": "login"}
#: The roles of the blocks that set the lab up, in the page's order.
SETUP = {"install", "all", "head", "gpu", "login"}
#: `scp [user@]HOST:PATH ... DIR` on one file system: PATH is the head host's (the page's
#: paths are the same on every host; the lab's differ, so the local GQ_ETC is swapped for the
#: head's).
SCP = r'''
scp() {
    local args=() a
    for a in "$@"; do
        case "$a" in
            *:*) a="${a#*:}"; a="$LAB_HEAD_ETC${a#"$GQ_ETC"}" ;;
        esac
        args+=("$a")
    done
    cp -p "${args[@]}"
}
'''


def blocks(roles: set[str] | None = None) -> list[tuple[str, str]]:
    """(role, shell text) of the page's lab blocks, in order."""
    found = [(m[1], m[2]) for m in BLOCK.finditer(INSTALL.read_text())]
    return [b for b in found if roles is None or b[0] in roles]


@dataclass
class Lab:
    root: Path
    tag: int
    addrs: dict[str, str]
    users: list[User] = field(default_factory=list)

    def ns(self, host: str) -> str:
        return f"gql{self.tag}{host}"

    def dir(self, host: str) -> Path:
        return self.root / host

    def env(self, host: str) -> dict[str, str]:
        """The page's variables as the lab sets them on `host`."""
        bindir = str(self.root / "bin")
        return {
            "PATH": f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8",
            "PREFIX": str(self.root / "opt" / "gq"), "BINDIR": bindir,
            "MANDIR": str(self.root / "man"),
            "GQ_ETC": str(self.dir(host) / "etc"),
            "GQ_CONFIG": str(self.dir(host) / "etc" / "gq.toml"), "GQ_STATE": str(self.dir(host) / "var"),
            "GQ_RUN": str(self.dir(host) / "run"), "HEAD": self.addrs["head"],
            "NODES": " ".join(h for h, r in HOSTS.items() if r == "gpu"),
            "LOGINS": " ".join(h for h, r in HOSTS.items() if r == "login"),
            "NODE": host, "LOGIN": host, "GQNODE_FLAGS": "--fake-gpus 8",
            "LAB_HEAD_ETC": str(self.dir("head") / "etc"),
            # pip's configuration here (its index, wheel cache) comes from the environment.
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
        }

    def sh(self, host: str, script: str, user: User | None = None, check: bool = True,
           timeout: float = 120, netns: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell script on `host` (as `user`, from their home, else as root in the repo);
        with `netns` false, in this machine's network instead of the host's namespace."""
        env = self.env(host)
        cmd = ["ip", "netns", "exec", self.ns(host)] if netns else []
        if user is not None:
            env = {"PATH": env["PATH"], "HOME": str(user.home), "USER": user.name,
                   "LOGNAME": user.name, "LANG": "C.UTF-8", "GQ_TIMEOUT": "20",
                   "GQ_CONFIG": str(self.dir(host) / "etc" / "gq.toml")}
            cmd += ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]
        proc = subprocess.run([*cmd, "bash", "-euo", "pipefail", "-c", SCP + script], env=env,
                              cwd=user.home if user else REPO, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"on {host}{' as ' + user.name if user else ''}: exit "
                        f"{proc.returncode}\n{script}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def role(self, role: str, text: str) -> None:
        """A page block, on every host of its role."""
        if role == "install":
            # One file system: installed once for all hosts, from this machine's network (the
            # lab's hosts have no route to the package index).
            self.sh("head", text, timeout=600, netns=False)
            return
        for host, kind in HOSTS.items():
            if role in ("all", kind):
                self.sh(host, text)

    def gq(self, user: User, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`gq ARGS` as `user` on the login host."""
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
        return self.sh("login1", f"gq {quoted}", user=user, check=check)

    def submit(self, user: User, *args: str) -> int:
        return int(self.gq(user, "submit", "--parsable", *args).stdout.strip())

    def client(self) -> Client:
        """gqd's own socket on the head host, as root (an admin) there."""
        return Client(config_mod.load(self.dir("head") / "etc" / "gq.toml"))

    def show(self, job_id: int) -> dict:
        with self.client() as c:
            return c.show(job_id)

    def wait_state(self, job_id: int, *states: str, timeout: float = 90) -> dict:
        try:
            return wait_for(lambda: (j := self.show(job_id))["state"] in states and j,
                            f"job {job_id} to be {'/'.join(states)}", timeout=timeout)
        except pytest.fail.Exception as exc:  # seen once in CI: say what each side did
            tails = "\n".join(f"--- {host} {name} (end)\n{self.log(host, name)[-3000:]}"
                              for host, name in (("head", "gqd.log"), ("gpu01", "gqnode.log"),
                                                 ("gpu02", "gqnode.log")))
            pytest.fail(f"{exc}\njob: {self.show(job_id)}\n{tails}")

    def log(self, host: str, name: str) -> str:
        path = self.dir(host) / "var" / name
        return path.read_text(errors="replace") if path.exists() else ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _network(lab: Lab) -> None:
    """The four namespaces; a bridge in the head's, a veth from it to each other host's."""
    head = lab.ns("head")
    _ip("netns", "add", head)
    _ip("-n", head, "link", "set", "lo", "up")
    _ip("-n", head, "link", "add", "br0", "type", "bridge")
    _ip("-n", head, "addr", "add", f"{lab.addrs['head']}/24", "dev", "br0")
    _ip("-n", head, "link", "set", "br0", "up")
    for i, host in enumerate(h for h in HOSTS if h != "head"):
        ns = lab.ns(host)
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", head, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
            "netns", ns)
        _ip("-n", head, "link", "set", f"v{i}", "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{lab.addrs[host]}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")


def _add_user(lab: Lab, name: str) -> User:
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True,
                   capture_output=True)
    pw = pwd.getpwnam(name)
    user = User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), work=Path(pw.pw_dir))
    lab.users.append(user)
    return user


def _stop(lab: Lab) -> None:
    """The page's stop commands; then whatever of the lab's is left is killed."""
    for pid_file in (lab.dir("login1") / "run" / "relay.sock.pid",
                     *(lab.dir(h) / "var" / "node" / "gqnode.pid" for h in ("gpu01", "gpu02")),
                     lab.dir("head") / "var" / "gqd.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 30
    while _leftovers(lab) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in _leftovers(lab):
        proc.kill()


def _leftovers(lab: Lab) -> list[psutil.Process]:
    names = {u.name for u in lab.users}
    found = []
    for proc in psutil.process_iter(["cmdline", "username"]):
        try:
            if proc.pid != os.getpid() and (str(lab.root) in " ".join(proc.info["cmdline"] or [])
                                            or proc.info["username"] in names):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    tag = os.getpid() % 1000
    root = Path(tempfile.mkdtemp(prefix="gq-lab-", dir="/tmp"))
    root.chmod(0o755)  # users reach the installed gq and the login host's socket through it
    net = 10 + tag % 240
    lab = Lab(root, tag, {h: f"10.234.{net}.{i + 1}" for i, h in enumerate(HOSTS)})
    try:
        _network(lab)
        for user in ("a", "b"):
            _add_user(lab, f"gql{tag}{user}")
        for role, text in blocks(SETUP):
            lab.role(role, text)
        wait_for(lambda: "connected to gqd" in lab.log("login1", "relay.log"),
                 "the login host's relay to connect", timeout=60)
        with lab.client() as c:
            wait_for(lambda: {n["name"] for n in c.nodes() if n["state"] == "UP"}
                     == {"gpu01", "gpu02"}, "both GPU hosts to register", timeout=60)
        yield lab
    finally:
        _stop(lab)
        for host in HOSTS:
            subprocess.run(["ip", "netns", "del", lab.ns(host)], capture_output=True)
        for user in lab.users:
            subprocess.run(["userdel", "--remove", user.name], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_the_head_lists_the_gpu_hosts_and_holds_only_public_keys_of_others(lab: Lab) -> None:
    (text,) = [t for r, t in blocks({"head-check"})]
    out = lab.sh("head", text).stdout
    assert "gpu01" in out and "gpu02" in out
    keys = lab.dir("head") / "etc" / "keys"
    assert sorted(p.name for p in keys.glob("*.key_secret")) == ["gqd.key_secret"]
    for host in ("gpu01", "gpu02", "login1"):
        secret = lab.dir(host) / "etc" / "keys" / f"{host}.key_secret"
        assert secret.stat().st_mode & 0o777 == 0o600
    # The installed programs belong to no one's home: users run them as themselves.
    assert (lab.root / "bin" / "gq").resolve().is_relative_to(lab.root / "opt" / "gq")


def test_a_first_job_and_a_job_that_submits_a_job_from_the_login_host(lab: Lab) -> None:
    alice = lab.users[0]
    first, chain = (t for r, t in blocks({"user"}))
    out = lab.sh("login1", first, user=alice).stdout
    assert re.search(rf"hello from gpu0[12] as {alice.name}", out), out
    lab.sh("login1", chain, user=alice)
    child = int((alice.home / "child.id").read_text())
    job = lab.show(child)
    assert (job["state"], job["user"]) == ("COMPLETED", alice.name)
    assert re.search(rf"submit by {alice.name} \(uid {alice.uid}\) via node gpu0[12]",
                     lab.log("head", "gqd.log"))
    assert f"submit by {alice.name} (uid {alice.uid}) via relay login1" in lab.log(
        "head", "gqd.log")


def test_two_users_submit_follow_wait_and_cancel_from_the_login_host(lab: Lab) -> None:
    alice, bob = lab.users
    shape = 'id -un; echo "$GQ_NODE_RANK $GQ_NODELIST $GQ_GPUS"'
    jobs = {(user.name, args): lab.submit(user, *args, "-o", "shape-%j.out", "--wrap", shape)
            for user in (alice, bob) for args in (("-g", "1"), ("-g", "8"), ("-N", "2", "-g", "8"))}
    for (name, args), job_id in jobs.items():
        done = lab.wait_state(job_id, "COMPLETED", "FAILED")
        assert (done["state"], done["user"]) == ("COMPLETED", name), done
        home = Path(pwd.getpwnam(name).pw_dir)
        out = (home / f"shape-{job_id}.out").read_text().split("\n")
        assert out[0] == name, "the job ran as its owner"
        assert (home / f"shape-{job_id}.out").stat().st_uid == pwd.getpwnam(name).pw_uid
        rank, nodelist, gpus = out[1].split(" ")
        want_nodes = 2 if "-N" in args else 1
        assert len(nodelist.split(",")) == want_nodes and set(nodelist.split(",")) <= {
            "gpu01", "gpu02"}
        assert len(gpus.split(",")) == int(args[-1])

    # Logs followed until the job ends; wait returns the job's exit status.
    job = lab.submit(alice, "-o", "follow-%j.out", "--wrap",
                     "for i in 1 2 3; do echo line $i; sleep 0.5; done; exit 3")
    follow = lab.gq(alice, "logs", "-f", str(job))
    assert follow.stdout.splitlines() == ["line 1", "line 2", "line 3"], follow.stdout
    waited = lab.gq(alice, "wait", str(job), check=False)
    assert waited.returncode == 3, waited.stderr

    # Each cancels their own job and fails to cancel the other's.
    mine = {u.name: lab.submit(u, "-t", "5", "--wrap", "sleep 300") for u in (alice, bob)}
    for job_id in mine.values():
        lab.wait_state(job_id, "RUNNING")
    for user, other in ((alice, bob), (bob, alice)):
        refused = lab.gq(user, "cancel", str(mine[other.name]), check=False)
        assert refused.returncode == 1 and "permission denied" in refused.stderr, refused.stderr
        assert lab.show(mine[other.name])["state"] == "RUNNING"
    for user in (alice, bob):
        lab.gq(user, "cancel", str(mine[user.name]))
        lab.wait_state(mine[user.name], "CANCELLED")
    history = lab.gq(bob, "history").stdout
    assert str(mine[bob.name]) in history


def test_a_relay_restarted_under_load_loses_no_acknowledged_submit(lab: Lab) -> None:
    """Both users submit in a loop while the relay is stopped and started again (section 8):
    every id a client got back is a job in gqd."""
    # Until told to stop (at most 500 submits): a loop of a fixed length could end while the
    # relay is still down, and then nothing would go through the restarted one.
    loop = ("for i in $(seq 1 500); do [ -e stop ] && break; "
            "if id=$(gq submit --parsable -t 1 --wrap true 2>>errors); then echo $id >> ids; fi;"
            " done")
    for user in lab.users:
        for name in ("ids", "errors", "stop"):
            (user.home / name).unlink(missing_ok=True)
    env = lab.env("login1")
    loops = [subprocess.Popen(
        ["ip", "netns", "exec", lab.ns("login1"), "setpriv", f"--reuid={u.uid}",
         f"--regid={u.gid}", "--init-groups", "bash", "-c", loop],
        env={"PATH": env["PATH"], "HOME": str(u.home), "USER": u.name, "GQ_TIMEOUT": "20",
             "GQ_CONFIG": str(lab.dir("login1") / "etc" / "gq.toml")},
        cwd=u.home, stdin=subprocess.DEVNULL) for u in lab.users]

    def acked() -> list[int]:
        return [int(x) for u in lab.users if (u.home / "ids").exists()
                for x in (u.home / "ids").read_text().split()]
    try:
        wait_for(lambda: len(acked()) >= 4, "the loops to get submits through")
        before = len(acked())
        pid_file = lab.dir("login1") / "run" / "relay.sock.pid"
        old = int(pid_file.read_text())
        start = next(t for r, t in blocks({"login"}) if "gq relay" in t)
        lab.sh("login1", f"kill $(cat \"$GQ_RUN/relay.sock.pid\")\n"
               f"while kill -0 {old} 2>/dev/null; do sleep 0.1; done\n{start}")
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip()
                 and int(pid_file.read_text()) != old, "the relay to start again")
        restarted = len(acked())
        wait_for(lambda: len(acked()) >= restarted + 4, "submits through the restarted relay")
        for user in lab.users:
            (user.home / "stop").touch()
        for proc in loops:
            assert proc.wait(timeout=300) == 0
    finally:
        for proc in loops:
            if proc.poll() is None:
                proc.kill()
    ids = acked()
    assert len(ids) > before, "submits went through the restarted relay"
    with lab.client() as c:
        for job_id in ids:
            assert c.show(job_id)["user"] in {u.name for u in lab.users}
    assert lab.log("login1", "relay.log").count("serving") == 2


def test_jobs_outlive_a_rolling_restart_of_the_gpu_hosts(lab: Lab) -> None:
    alice = lab.users[0]
    job = lab.submit(alice, "-N", "2", "-g", "8", "-o", "rolling-%j.out", "--wrap",
                     'sleep 4; echo "survived on $GQ_NODELIST"')
    lab.wait_state(job, "RUNNING")
    (restart,) = (t for r, t in blocks({"gpu-restart"}))
    for host in ("gpu01", "gpu02"):
        before = lab.log(host, "gqnode.log").count("adopted")
        lab.sh(host, restart)
        wait_for(lambda: lab.log(host, "gqnode.log").count("adopted") > before,
                 f"{host}'s gqnode to start again")
    done = lab.wait_state(job, "COMPLETED", "FAILED", "NODE_FAIL")
    assert (done["state"], done["restart_count"]) == ("COMPLETED", 0), done
    assert "survived on gpu01,gpu02" in (alice.home / f"rolling-{job}.out").read_text()


def test_a_users_job_steps_run_as_them_on_both_gpu_hosts(lab: Lab) -> None:
    """Issue 15 (Done when 2), as a user of the lab: srun in alice's job reaches gqd through
    its node, and starts her tasks as her on both GPU hosts, each network namespace apart."""
    alice = lab.users[0]
    task = ('echo "task $SLURM_PROCID local $SLURM_LOCALID on $SLURMD_NODENAME '
            'gpus $CUDA_VISIBLE_DEVICES as $(id -un)"')
    job = lab.submit(alice, "-N", "2", "--ntasks-per-node", "2", "--gpus-per-task", "1",
                     "-o", "steps-%j.out", "--wrap",
                     f"srun -n 4 --ntasks-per-node 2 --gpus-per-task 1 sh -c '{task}'; "
                     "echo srun=$?; srun -K -n 2 sh -c 'exit $SLURM_PROCID'; echo bad=$?")
    done = lab.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    out = (alice.home / f"steps-{job}.out").read_text()
    assert done["state"] == "COMPLETED", out
    lines = sorted(line for line in out.splitlines() if line.startswith("task "))
    assert len(lines) == 4 and all(line.endswith(f" as {alice.name}") for line in lines), out
    nodes = sorted(done["node_list"])
    seen = {(int(line.split()[1]), int(line.split()[3]), line.split()[5], line.split()[7])
            for line in lines}
    assert {(p, loc, host) for p, loc, host, _ in seen} == {
        (0, 0, nodes[0]), (1, 1, nodes[0]), (2, 0, nodes[1]), (3, 1, nodes[1])}, out
    for host in nodes:
        gpus = [g for _, _, h, g in seen if h == host]
        assert len(set(gpus)) == 2 and all("," not in g for g in gpus), out
    assert "srun=0\n" in out and "bad=1\n" in out, out
    assert (alice.home / f"steps-{job}.out").stat().st_uid == alice.uid
    history = lab.gq(alice, "history", "-j", str(job), "-p").stdout
    assert f"\n{job}.0|sh|{alice.name}|" in history and f"\n{job}.1|sh|" in history, history
