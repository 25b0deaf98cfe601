"""Jobs confined in cgroups, on live clusters (cgroup v1, as this host has): memory limits that end
a job OUT_OF_MEMORY, cpusets, device rules for GPUs, every process killed at the end, peak
memory and CPU time in `gq show`, re-adoption across a gqnode restart, a private /tmp."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gq.node import cgroups as cg
from tests.conftest import LiveCluster, prepare, running, wait_for
from tests.isolation_env import fake_gpu_nodes, needs_v1, nvidia_driver, run_cgroup

pytestmark = needs_v1
M = 1 << 20


@contextlib.contextmanager
def confined(root: Path, fake_gpus: str = "2", **node: object) -> Iterator[LiveCluster]:
    """One node with cgroups = "v1" (gqnode refuses to start if v1 does not work) and the
    given [node] keys."""
    root.mkdir(parents=True, exist_ok=True)
    live = prepare(root)

    def change(cfg: object) -> None:
        cfg.node.cgroups = "v1"  # type: ignore[attr-defined]
        for key, value in node.items():
            setattr(cfg.node, key, value)  # type: ignore[attr-defined]
    live.configure(change)
    with running(live, nodes=1, fake_gpus=fake_gpus) as up:
        yield up


def _script(live: LiveCluster, name: str, text: str) -> str:
    path = live.work / name
    path.write_text("#!/bin/sh\n" + text)
    return str(path)


def _cgroup(live: LiveCluster, job_id: int, restart: int = 0) -> dict[str, str]:
    return run_cgroup(live.config().node.cgroup_root, "node1", job_id, restart)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_job_over_its_memory_limit_ends_out_of_memory_and_its_neighbour_is_untouched(
        tmp_path: Path) -> None:
    with confined(tmp_path) as live:
        neighbour = live.submit("--mem", "200M", _script(live, "neighbour.sh", """\
exec python3 -c '
import os, time
held = b"n" * (50 << 20)             # 50M, touched: under its own 200M limit
open("neighbour.ready", "w").close()
while not os.path.exists("go"):
    time.sleep(0.05)
print(len(held))
'
"""))
        wait_for(lambda: (live.work / "neighbour.ready").exists(), "the neighbour to allocate")
        hog = live.submit("--mem", "100M", _script(live, "hog.sh", """\
python3 -c 'b = b"x" * (400 << 20)'   # 400M under a 100M limit
"""))
        job = live.wait_state(hog, "OUT_OF_MEMORY", "COMPLETED", "FAILED")
        (live.work / "go").touch()
        assert job["state"] == "OUT_OF_MEMORY", job
        assert "out of memory" in job["reason"] and "100M" in job["reason"], job["reason"]
        assert job["exit_code"] == 128 + signal.SIGKILL  # the OOM killer's
        assert 50 * M < job["max_rss"] <= 100 * M, job["max_rss"]
        assert job["total_cpu_s"] is not None and job["total_cpu_s"] > 0
        other = live.wait_state(neighbour, "COMPLETED", "FAILED", "OUT_OF_MEMORY")
        assert (other["state"], other["exit_code"]) == ("COMPLETED", 0), other
        assert 50 * M <= other["max_rss"] < 100 * M, other["max_rss"]
        # `gq show` prints them (Slurm's MaxRSS, TotalCPU); `gq history` lists the state.
        shown = live.gq("show", str(hog), check=True).stdout
        assert "JobState=OUT_OF_MEMORY" in shown and "MaxRSS=100M" in shown, shown
        history = live.gq("history", "--state", "OOM", "--parsable", check=True).stdout
        rows = [line.split("|") for line in history.splitlines()[1:]]
        assert [(r[0], r[5], r[-2]) for r in rows] == [(str(hog), "OUT_OF_MEMORY", "100M")]


def test_one_cpu_job_spinning_four_processes_gets_one_cpus_time(tmp_path: Path) -> None:
    # Four busy loops would take both of this host's CPUs; -c 1 gives the job a cpuset of one.
    quiet = os.getloadavg()[0] < 1.0
    with confined(tmp_path) as live:
        job_id = live.submit("-c", "1", _script(live, "spin.sh", """\
grep Cpus_allowed_list /proc/self/status > cpus.out
start=$(date +%s.%N)
pids=
for i in 1 2 3 4; do (while :; do :; done) & pids="$pids $!"; done
sleep 4
kill $pids
end=$(date +%s.%N)
echo "$start $end" > spin.out
"""))
        job = live.wait_state(job_id, "COMPLETED", "FAILED")
        assert job["state"] == "COMPLETED", job
        allowed = (live.work / "cpus.out").read_text().split(":")[1].strip()
        assert len(cg.parse_cpu_list(allowed)) == 1, allowed
        start, end = map(float, (live.work / "spin.out").read_text().split())
        share = job["total_cpu_s"] / (end - start)
        print(f"-c 1, 4 spinners: {job['total_cpu_s']:.2f} CPU-s in {end - start:.2f} s: "
              f"{share:.2f} CPUs")
        # At most one CPU's worth (with the shell's own start-up; unconfined, an idle host of
        # two CPUs gives it two). How much of it the job got depends on the host's other load.
        assert 0.05 < share <= 1.1, share
        if quiet:  # a quiet host: about one CPU, not a fraction of one
            assert share >= 0.7, share
        assert "TotalCPU=00:0" in live.gq("show", str(job_id), check=True).stdout


def test_a_job_opens_only_its_own_gpus_device_file(tmp_path: Path) -> None:
    dev = fake_gpu_nodes(tmp_path / "dev", 2)
    with confined(tmp_path / "cluster", dev_dir=str(dev)) as live:
        job_id = live.submit("-g", "1", _script(live, "open.sh", f"""\
echo "$GQ_GPUS" > gpus.out
python3 -c '
import errno, os
for n in (0, 1):
    try:
        os.close(os.open("{dev}/nvidia%d" % n, os.O_RDWR))
        print(n, "opened")
    except OSError as e:
        print(n, errno.errorcode[e.errno])
' > open.out
"""))
        assert live.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
        mine = int((live.work / "gpus.out").read_text())
        result = dict(line.split() for line in (live.work / "open.out").read_text().splitlines())
        # Its own GPU reaches the driver (absent here: ENXIO); the other is denied.
        assert result[str(mine)] == ("opened" if nvidia_driver() else "ENXIO"), result
        assert result[str(1 - mine)] == errno.errorcode[errno.EPERM], result


ESCAPER = """\
cut -d' ' -f6 /proc/$$/stat > job.sid
setsid sh -c 'sleep 600 & echo $! > escaped.pid' &
while [ ! -s escaped.pid ]; do sleep 0.05; done
[ "$1" = end ] && exit 0
exec sleep 600
"""


@pytest.mark.parametrize("how", ["end", "cancel", "timeout", "shepherd killed"])
def test_a_process_that_left_the_jobs_session_dies_with_the_job(tmp_path: Path,
                                                                 how: str) -> None:
    with confined(tmp_path) as live:
        opts = ["--time", "3s"] if how == "timeout" else []
        job_id = live.submit(*opts, _script(live, "escape.sh", ESCAPER), how.split()[0])
        pid_file = live.work / "escaped.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the escape")
        escaped = int(pid_file.read_text())
        # The job's own session, as it recorded it (with `end` it may be gone already).
        job_sid = int((live.work / "job.sid").read_text())
        assert os.getsid(escaped) != job_sid, "it left the session"
        assert _alive(escaped)
        if how == "cancel":
            live.gq("cancel", str(job_id), check=True)
        elif how == "shepherd killed":
            os.kill(_shepherd_pid(live, job_id), signal.SIGKILL)
        expected = {"end": "COMPLETED", "cancel": "CANCELLED", "timeout": "TIMEOUT",
                    "shepherd killed": "RUNNING"}[how]  # lost to a node fault: requeued
        if how == "shepherd killed":
            wait_for(lambda: live.show(job_id)["restart_count"] == 1, "the run to be requeued")
        else:
            assert live.wait_state(job_id, expected, "COMPLETED", "FAILED")["state"] == expected
        wait_for(lambda: not _alive(escaped), "the escaped process to be killed", timeout=10)
        wait_for(lambda: not any(os.path.exists(d) for d in _cgroup(live, job_id).values()),
                 "the run's cgroup to be removed", timeout=10)
        if how == "shepherd killed":
            live.gq("cancel", str(job_id), check=True)


def _run_dir(live: LiveCluster, job_id: int, restart: int = 0) -> Path:
    return live.layout.node_dir("node1") / "jobs" / f"{job_id}.{restart}"


def _shepherd_pid(live: LiveCluster, job_id: int) -> int:
    from gq.node.shepherd import PID_FILE, read_pid
    return wait_for(lambda: read_pid(_run_dir(live, job_id), "shepherd", PID_FILE)[0],
                    "the shepherd's pid")


def test_a_jobs_cgroup_outlives_a_gqnode_restart_and_leftovers_are_removed(
        tmp_path: Path) -> None:
    with confined(tmp_path) as live:
        job_id = live.submit(_script(live, "escape.sh", ESCAPER), "stay")
        pid_file = live.work / "escaped.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the escape")
        escaped = int(pid_file.read_text())
        dirs = _cgroup(live, job_id)
        assert str(escaped) in cg.read(os.path.join(dirs["freezer"], cg.STEP_BATCH,
                                                    "cgroup.procs"))
        os.kill(live.node_pid("node1"), signal.SIGKILL)
        wait_for(lambda: live.node_pid("node1") is None, "gqnode to die")
        # A run the node no longer has left its cgroup, with a process in it.
        leftover = _cgroup(live, 999)
        stray = subprocess.Popen(["sleep", "600"])
        try:
            for name, path in leftover.items():
                os.mkdir(path)
                if name == "cpuset":
                    for key in ("cpuset.cpus", "cpuset.mems"):
                        cg.write(os.path.join(path, key),
                                 cg.read(os.path.join(os.path.dirname(path), key)))
                cg.write(os.path.join(path, "cgroup.procs"), str(stray.pid))
            assert live.gq("up").returncode == 0, live.log("node1")
            assert stray.wait(timeout=30) == -signal.SIGKILL
        finally:
            stray.kill()
            stray.wait()
        wait_for(lambda: not any(os.path.exists(p) for p in leftover.values()),
                 "the leftover cgroup to be removed")
        # The adopted run kept its cgroup, with everything in it, and still ends it all.
        assert live.show(job_id)["state"] == "RUNNING"
        assert all(os.path.isdir(p) for p in dirs.values())
        assert _alive(escaped)
        live.gq("cancel", str(job_id), check=True)
        assert live.wait_state(job_id, "CANCELLED", "FAILED")["state"] == "CANCELLED"
        wait_for(lambda: not _alive(escaped), "the escaped process to be killed", timeout=10)
        # gqd records the cancel at once; the shepherd removes the cgroup once all is killed.
        wait_for(lambda: not any(os.path.exists(p) for p in dirs.values()),
                 "the job's cgroup to be removed", timeout=10)


def test_each_job_has_a_private_tmp_removed_at_its_end() -> None:
    # The cluster's files must be outside /tmp, which its jobs do not see.
    root = Path(tempfile.mkdtemp(prefix="gq-test-", dir="/var/tmp"))
    mark = f"gq-private-{os.getpid()}-{time.time_ns()}"
    try:
        with confined(root / "cluster", private_tmp=True) as live:
            script = _script(live, "tmp.sh", f"""\
echo "$GQ_JOB_ID" > /tmp/{mark}
touch ready.$GQ_JOB_ID
while [ ! -e go ]; do sleep 0.05; done
ls -A /tmp > seen.$GQ_JOB_ID
cat /tmp/{mark} >> seen.$GQ_JOB_ID
""")
            ids = [live.submit(script), live.submit(script)]
            wait_for(lambda: all((live.work / f"ready.{i}").exists() for i in ids),
                     "both jobs to write their /tmp")
            tmp = live.layout.node_dir("node1") / "tmp"
            for job_id in ids:  # on the host: in each job's own directory, not in /tmp
                assert (tmp / f"{job_id}.0" / mark).read_text() == f"{job_id}\n"
            assert not Path("/tmp", mark).exists()
            (live.work / "go").touch()
            for job_id in ids:
                assert live.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
                assert (live.work / f"seen.{job_id}").read_text() == f"{mark}\n{job_id}\n"
                assert not (tmp / f"{job_id}.0").exists(), "removed at its end"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_job_step_gets_a_cgroup_of_its_own_under_the_jobs(tmp_path: Path) -> None:
    """What `srun` inside a job will use: a step's cgroup beside the batch script's, under the
    job's limits; the job's end kills the step's processes too."""
    from gq.node.cgroups_v1 import V1Backend
    v1, _ = cg.host_hierarchies()
    backend = V1Backend(v1, f"gq-test-{os.getpid()}", "n1")
    backend.prepare()
    job = cg.job_cgroup(backend.run(1, 0), cg.Limits(mem=64 * M, cpus=(0,)))
    try:
        job.create()
        step = job.for_step("step_0")
        step.create_step()
        with step.entered():
            proc = subprocess.Popen(["sleep", "600"])
        own = {line.split(":")[1]: line.split(":")[2]
               for line in Path(f"/proc/{proc.pid}/cgroup").read_text().splitlines()}
        assert own["memory"].endswith("/n1/job_1.0/step_0") and own["cpuset"].endswith(
            "/job_1.0/step_0"), own
        assert cg.read(os.path.join(job.dirs["cpuset"], "step_0", "cpuset.cpus")).strip() == "0"
        assert proc.pid in job.pids()
        assert job.kill(5.0, lambda: None) and proc.wait(timeout=5) == -signal.SIGKILL
        with pytest.raises(ValueError):
            job.for_step("../escape")
    finally:
        job.remove()
        backend.close()
    assert not any(os.path.exists(d) for d in backend.node_dirs.values())


def test_a_gqnode_stopping_while_a_shepherd_starts_keeps_the_cgroups_it_goes_into(
        tmp_path: Path) -> None:
    # Seen in CI: gqnode stopped 11 ms after forking a shepherd, removed its node's (still
    # empty) cgroup directories, and the shepherd's mkdir of its run's cgroup failed (ENOENT):
    # the run ended NODE_FAIL and the restarted node drained itself.
    from gq.config import NodeConfig
    from gq.node.daemon import NodeDaemon, Run
    from gq.node.gpus import open_gpus
    from gq.node.isolation import NodeIsolation

    class NoSignals:
        def watch_children(self) -> None:
            pass

    def node() -> tuple[NodeDaemon, list[str]]:
        cfg = NodeConfig(cgroups="v1", cgroup_root=f"/gq-test-{os.getpid()}")
        isolation = NodeIsolation.configured(cfg, "n1", tmp_path, [], {}, cpus=0, mem=0)
        assert isolation.backend is not None
        daemon = NodeDaemon("n1", "tcp://127.0.0.1:9", tmp_path, open_gpus("1"), cpus=1, mem=1,
                            addr="n1", heartbeat_s=1.0, signals=NoSignals(),  # type: ignore[arg-type]
                            isolation=isolation)
        return daemon, list(isolation.backend.node_dirs.values())  # type: ignore[attr-defined]

    daemon, dirs = node()
    assert dirs and all(os.path.isdir(d) for d in dirs)
    # A run just launched: its shepherd has not made its cgroup yet.
    daemon.runs[(5, 0)] = Run(5, 0, tmp_path / "jobs" / "5.0", os.getpid(), 0.0, child=True)
    daemon.close()
    assert all(os.path.isdir(d) for d in dirs), "the node's cgroups went with a run live"
    daemon, dirs = node()
    daemon.close()  # no run live: they go (and come back at start)
    assert not any(os.path.exists(d) for d in dirs)
