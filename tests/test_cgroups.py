"""The cgroup backends without a cluster: what each writes (v2 and systemd, as unit tests; the
v2 backend's device program and kill also on this host's unified hierarchy), how gqnode plans a
run's limits, CPUs and device rules, and where the hierarchies are found."""

from __future__ import annotations

import errno
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from gq import config as config_mod
from gq import protocol
from gq.errors import ConfigError, ProtocolError
from gq.messages import ArrayTask, Launch, RunSpec
from gq.model import Gpu
from gq.node import cgroups as cg
from gq.node import cgroups_bpf, cgroups_v2
from gq.node.cgroups_v1 import V1Backend
from gq.node.isolation import NodeIsolation, RunIsolation, job_memory
from tests.isolation_env import fake_gpu_nodes, needs_v2, nvidia_driver

M = 1 << 20

HYBRID_MOUNTINFO = """\
25 30 0:23 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
28 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
29 25 0:27 /lxc/box /sys/fs/cgroup/my\\040pids rw shared:5 - cgroup cgroup rw,pids
30 25 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
"""
HYBRID_CGROUP = """\
9:name=systemd:/
4:memory:/process_api/abc
3:cpu,cpuacct:/
2:pids:/lxc/box/inner
0::/user.slice
"""


def test_hierarchies_are_found_co_mounted_nested_and_escaped() -> None:
    v1, v2 = cg.hierarchies(HYBRID_MOUNTINFO, HYBRID_CGROUP)
    assert set(v1) == {"cpuacct", "memory", "pids"}  # cpu is not one gq uses
    assert v1["cpuacct"].controllers == frozenset({"cpuacct"})
    assert v1["memory"].dir(v1["memory"].own) == "/sys/fs/cgroup/memory/process_api/abc"
    # A container's mount shows its own part of the tree at its mount point.
    assert v1["pids"].mount == "/sys/fs/cgroup/my pids"
    assert v1["pids"].dir("/lxc/box/inner") == "/sys/fs/cgroup/my pids/inner"
    # cgroup_root: absolute in the hierarchy, or under our own cgroup.
    assert v1["memory"].base("/gq") == "/sys/fs/cgroup/memory/gq"
    assert v1["memory"].base("gq") == "/sys/fs/cgroup/memory/process_api/abc/gq"
    assert v2 is not None and (v2.mount, v2.own) == ("/sys/fs/cgroup/unified", "/user.slice")


def test_limits_and_the_launch_file_round_trip() -> None:
    limits = cg.Limits(mem=100 * M, cpus=(1, 3), pids=64, deny=((195, 1),),
                       allow=((195, 0), (195, 255)))
    packed = msgpack.unpackb(msgpack.packb(limits.to_dict()), raw=False)
    assert cg.Limits.from_dict(packed) == limits
    assert cg.parse_cpu_list("0-2,5,7-8\n") == (0, 1, 2, 5, 7, 8)
    assert cg.cpu_list((0, 2)) == "0,2"
    assert cg.run_key("job_12.3") == (12, 3) and cg.run_key("step_batch") is None
    assert cg.node_part("gpu-01.lab") == "gpu-01.lab" and cg.node_part("a/b") == "a_2fb"


# ---------------------------------------------------------------- the device program


def _run_program(code: bytes, dev_type: int, major: int, minor: int) -> int:
    """Interpret the device program's instructions (the subset it uses) on one device."""
    ctx = struct.pack("<III", (6 << 16) | dev_type, major, minor)  # read+write access
    regs, pc = [0] * 11, 0
    insns = [struct.unpack("<BBhi", code[i:i + 8]) for i in range(0, len(code), 8)]
    while True:
        op, r, off, imm = insns[pc]
        dst, src = r & 0xF, r >> 4
        pc += 1
        if op == 0x61:
            regs[dst] = struct.unpack_from("<I", ctx, off + (0 if src == 1 else -1))[0]
        elif op == 0x57:
            regs[dst] &= imm
        elif op == 0xB7:
            regs[dst] = imm
        elif op in (0x55, 0x15):
            if (regs[dst] != imm) == (op == 0x55):
                pc += off
        elif op == 0x95:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


def test_the_device_program_denies_exactly_the_listed_char_devices() -> None:
    code = cgroups_bpf.program(((195, 1), (195, 3), (240, 0)))
    char, block = 2, 1
    assert [_run_program(code, char, 195, n) for n in range(5)] == [1, 0, 1, 0, 1]
    assert _run_program(code, char, 240, 0) == 0
    assert _run_program(code, char, 195, 255) == 1, "nvidiactl stays open"
    assert _run_program(code, block, 195, 1) == 1, "a block device of the same numbers"
    assert _run_program(code, char, 1, 3) == 1, "/dev/null"
    assert _run_program(cgroups_bpf.program(()), char, 195, 1) == 1


# ---------------------------------------------------------------- v2 and systemd


def _fake_v2(tmp_path: Path) -> cg.Hierarchy:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("\n")
    return cg.Hierarchy(str(tmp_path), "/", "/",
                        frozenset({"cpuset", "cpu", "io", "memory", "hugetlb", "pids"}))


def test_v2_enables_its_controllers_down_to_the_node_and_writes_the_runs_limits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = cgroups_v2.V2Backend(_fake_v2(tmp_path), "/gq", "n1")
    backend.prepare()
    wanted = "+cpu +cpuset +memory +pids"
    for level in ("", "gq", "gq/n1"):  # from the root's down to the node's
        assert (tmp_path / level / "cgroup.subtree_control").read_text() == wanted, level
    attached = []
    monkeypatch.setattr(cgroups_v2, "attach_devices", lambda *a: attached.append(a))
    desc = backend.run(7, 2)
    job = cg.job_cgroup(desc, cg.Limits(mem=100 * M, cpus=(1,), pids=50, deny=((195, 0),)))
    job.create()
    run = tmp_path / "gq" / "n1" / "job_7.2"
    assert {f.name: f.read_text() for f in run.iterdir() if f.is_file()} == {
        "memory.max": str(100 * M), "memory.swap.max": "0", "cpuset.cpus": "1",
        "pids.max": "50"}
    assert (run / cg.STEP_BATCH).is_dir()
    assert attached == [(str(run), ((195, 0),))]
    assert backend.runs() == [(7, 2)]
    (run / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (run / "memory.peak").write_text("73400320\n")
    (run / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n")
    assert job.usage() == cg.Usage(max_rss=73400320, cpu_s=2.5, oom_kills=1)


def test_v2_refuses_a_hierarchy_without_its_controllers(tmp_path: Path) -> None:
    bare = cg.Hierarchy(str(tmp_path), controllers=frozenset({"hugetlb"}))
    with pytest.raises(cg.CgroupConfigError, match="lacks the memory, cpuset, pids"):
        cgroups_v2.V2Backend(bare, "/gq", "n1").prepare()


PROC_DEVICES = """\
Character devices:
  1 mem
195 nvidia-frontend
509 nvidia-uvm

Block devices:
  8 sd
"""


def test_systemd_runs_the_job_in_a_transient_scope_with_the_limits_as_properties(
        tmp_path: Path) -> None:
    backend = cgroups_v2.SystemdBackend(_fake_v2(tmp_path), "/gq", "gpu-01")
    desc = backend.run(7, 0)
    desc["devices"] = cgroups_v2.device_groups(PROC_DEVICES)
    job = cg.job_cgroup(desc, cg.Limits(mem=100 * M, cpus=(2, 3), pids=50, deny=((195, 1),),
                                        allow=((195, 0), (195, 254), (195, 255))))
    argv, popen_switches = job.command(["/run/script", "a"], 1000, 100, switch=True)
    assert not popen_switches, "systemd-run switches to the user after making the scope"
    assert argv == [
        "systemd-run", "--scope", "--quiet", "--collect", "--unit=gq-gpu-01-job_7.0.scope",
        "--slice=gq.slice", "-p", "Delegate=yes", "-p", "CPUAccounting=yes",
        "-p", "MemoryAccounting=yes", "-p", f"MemoryMax={100 * M}", "-p", "MemorySwapMax=0",
        "-p", "AllowedCPUs=2,3", "-p", "TasksMax=50", "-p", "DevicePolicy=closed",
        "-p", "DeviceAllow=char-mem rwm", "-p", "DeviceAllow=char-nvidia-uvm rwm",
        "-p", "DeviceAllow=block-sd rwm", "-p", "DeviceAllow=/dev/char/195:0 rw",
        "-p", "DeviceAllow=/dev/char/195:254 rw", "-p", "DeviceAllow=/dev/char/195:255 rw",
        "--uid=1000", "--gid=100", "--", "/run/script", "a"]
    assert job.dir == str(tmp_path / "gq.slice" / "gq-gpu-01-job_7.0.scope")
    assert cgroups_v2.unit_escape("a b-c", dash=True) == "a\\x20b\\x2dc"


def test_systemd_scope_wraps_the_shepherds_command(tmp_path: Path) -> None:
    """A shepherd with the systemd backend starts the job through systemd-run (here a stand-in
    that records its arguments and runs the command) and reads the scope's cgroup."""
    from tests.test_signal import _finish
    from gq.node import shepherd
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemd-run").write_text('#!/bin/sh\necho "$@" > "$RECORD"\n'
                                         'while [ "$1" != -- ]; do shift; done\nshift\n'
                                         'exec "$@"\n')
    (bin_dir / "systemd-run").chmod(0o755)
    run_dir = tmp_path / "1.0"
    run_dir.mkdir()
    desc = cgroups_v2.SystemdBackend(_fake_v2(tmp_path / "cg"), "/gq", "n1").run(1, 0)
    launch = _launch_dict(run_dir, "#!/bin/sh\necho ran\n",
                          env={"PATH": f"{bin_dir}:{os.environ['PATH']}",
                               "RECORD": str(tmp_path / "argv")},
                          isolation={"limits": cg.Limits(mem=64 * M, pids=10).to_dict(),
                                     "cgroup": desc})
    (run_dir / shepherd.LAUNCH_FILE).write_bytes(msgpack.packb(launch, use_bin_type=True))
    status = _finish(shepherd.spawn(run_dir), run_dir)
    assert (status["state"], status["exit_code"]) == ("COMPLETED", 0)
    assert (run_dir / "out").read_text() == "ran\n"
    recorded = (tmp_path / "argv").read_text().split()
    assert recorded[:5] == ["--scope", "--quiet", "--collect", "--unit=gq-n1-job_1.0.scope",
                            "--slice=gq.slice"]
    assert f"MemoryMax={64 * M}" in recorded and "TasksMax=10" in recorded
    assert status["max_rss"] is None, "no such scope here: unknown, not made up"


def _launch_dict(run_dir: Path, script: str, **over: object) -> dict:
    spec = {"script": script, "name": "t", "args": [], "uid": os.getuid(), "gid": os.getgid(),
            "cwd": str(run_dir), "env": over.pop("env", {"PATH": os.environ["PATH"]})}
    return {"job_id": 1, "restart": 0, "spec": spec, "gpus": [], "rank": 0,
            "nodelist": ["n1"], "time_limit_s": 0, "stdout": str(run_dir / "out"),
            "stderr": str(run_dir / "out"), "job": {}, "grace_s": 5.0,
            "checkpoint_dir": str(run_dir / "ckpt"), **over}


@needs_v2
def test_v2_device_program_and_kill_on_this_hosts_unified_hierarchy(tmp_path: Path) -> None:
    """What this host's cgroup v2 has (no controllers: they are bound to v1): the eBPF device
    program denies the other GPU, a process out of the session is in the run's cgroup, and the
    kill takes it; cpu.stat gives the CPU time."""
    _, v2 = cg.host_hierarchies()
    assert v2 is not None
    dev = fake_gpu_nodes(tmp_path / "dev", 2)
    base = v2.base(f"gq-test-{os.getpid()}")
    os.mkdir(base)
    try:
        job = cgroups_v2.V2Job({"kind": "v2", "dir": f"{base}/job_1.0",
                                "home": v2.dir(v2.own)}, cg.Limits(deny=((195, 1),)))
        job.create()
        probe = ("import errno, os\nfor n in (0, 1):\n    try:\n"
                 f"        os.close(os.open('{dev}/nvidia%d' % n, os.O_RDWR)); print('opened')\n"
                 "    except OSError as e:\n        print(errno.errorcode[e.errno])\n"
                 # CPU time by its own clock, not a loop's length: a fast host ran 3M sums in 43 ms
                 "import time\nwhile time.process_time() < 0.2:\n    sum(range(100000))\n")
        with job.entered():
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                 text=True, check=True).stdout.split()
            escaped = subprocess.Popen(["setsid", "sleep", "600"])
        assert out == ["opened" if nvidia_driver() else "ENXIO", "EPERM"]
        assert escaped.pid in job.pids()
        assert job.kill(5.0, lambda: None)
        assert escaped.wait(timeout=5) == -signal.SIGKILL
        assert job.usage().cpu_s > 0.15  # the probe ran 0.2 s of CPU
        assert job.remove() and not os.path.exists(f"{base}/job_1.0")
    finally:
        cg.remove_tree(base)


# ---------------------------------------------------------------- gqnode's plan for a run


def _isolation(tmp_path: Path, **over: object) -> NodeIsolation:
    hierarchies = {c: cg.Hierarchy(f"/sys/fs/cgroup/{c}") for c in cg.V1_CONTROLLERS}
    kw: dict = dict(cpus=[0, 1, 2, 3], mem=64 << 30, pids_max=100,
                    devices={0: (195, 0), 1: (195, 1)}, other_gpus={(195, 7)})
    kw.update(over)
    return NodeIsolation(V1Backend(hierarchies, "/gq", "n1"), tmp_path, **kw)


def _msg(job_id: int, cpus: int = 0, mem: int = 0, gpus: list[int] | None = None) -> Launch:
    return Launch(job_id=job_id, restart=0, spec=RunSpec("", cpus=cpus, mem=mem),
                  gpus=tuple(gpus or ()), rank=0, nodelist=("n1",), time_limit_s=0,
                  stdout="/o", stderr="/e", job=ArrayTask())


def test_a_runs_cpus_are_free_ones_first_then_the_least_shared(tmp_path: Path) -> None:
    iso = _isolation(tmp_path)
    cpus = lambda plan: tuple(plan["limits"]["cpus"])  # noqa: E731
    assert cpus(iso.plan(_msg(1, cpus=2))) == (0, 1)
    assert cpus(iso.plan(_msg(2, cpus=1))) == (2,)
    assert cpus(iso.plan(_msg(3, cpus=2))) == (0, 3)  # one free CPU left, then a shared one
    assert cpus(iso.plan(_msg(4))) == (), "no -c: all the node's"
    iso.forget((1, 0))
    assert cpus(iso.plan(_msg(5, cpus=1))) == (1,)
    assert cpus(iso.plan(_msg(6, cpus=9))) == (0, 1, 2, 3), "no more than the node has"


def test_a_run_may_open_its_own_gpus_and_the_control_devices_only(tmp_path: Path) -> None:
    plan = _isolation(tmp_path).plan(_msg(1, mem=100 * M, gpus=[0]))
    limits = cg.Limits.from_dict(plan["limits"])
    assert limits.deny == ((195, 1), (195, 7)), "the other GPU, and one NVML did not list"
    assert limits.allow == ((195, 0), (195, 254), (195, 255))
    assert (limits.mem, limits.pids) == (100 * M, 100)
    assert plan["cgroup"]["dirs"]["memory"] == "/sys/fs/cgroup/memory/gq/n1/job_1.0"
    assert plan["tmp"] is None
    assert job_memory(RunSpec("", mem=0), 64 << 30) == 64 << 30, "no --mem: all the node offers"


def test_a_restarted_gqnode_knows_the_cpus_its_adopted_runs_hold(tmp_path: Path) -> None:
    from gq.node import shepherd
    first = _isolation(tmp_path)
    run_dir = tmp_path / "1.0"
    run_dir.mkdir()
    msg = _msg(1, cpus=2)
    launch = {**msg.wire(), "isolation": first.plan(msg)}
    (run_dir / shepherd.LAUNCH_FILE).write_bytes(msgpack.packb(launch, use_bin_type=True))
    again = _isolation(tmp_path)
    again.adopted((1, 0), run_dir)
    assert tuple(again.plan(_msg(2, cpus=2))["limits"]["cpus"]) == (2, 3)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_gpu_device_numbers_come_from_the_device_directory(tmp_path: Path) -> None:
    from gq.node.isolation import gpu_devices, gpu_files
    dev = tmp_path / "dev"
    dev.mkdir()
    subprocess.run(["mknod", str(dev / "nvidia3"), "c", "240", "9"], check=True)
    gpus = [Gpu(0, "fake", 1), Gpu(1, "fake", 1)]
    assert gpu_devices(gpus, {0: 3}, str(dev)) == {0: (240, 9), 1: (195, 1)}
    assert gpu_files(str(dev)) == {(240, 9)}


def test_without_cgroups_usage_comes_from_getrusage(tmp_path: Path) -> None:
    from tests.test_signal import _finish
    from gq.node import shepherd
    run_dir = tmp_path / "1.0"
    run_dir.mkdir()
    launch = _launch_dict(run_dir, "#!/bin/sh\nexec python3 -c 'import time\n"
                          "b = b\"x\" * (30 << 20)\n"
                          "while time.process_time() < 0.1: sum(range(100000))'\n")
    (run_dir / shepherd.LAUNCH_FILE).write_bytes(msgpack.packb(launch, use_bin_type=True))
    status = _finish(shepherd.spawn(run_dir), run_dir)
    assert status["state"] == "COMPLETED"
    assert status["max_rss"] >= 30 * M and status["cpu_s"] > 0.05
    assert not RunIsolation(None).tracks


# ---------------------------------------------------------------- config and protocol


@pytest.mark.parametrize("table,match", [
    ({"cgroups": "v3"}, "cgroups must be one of auto, v2, v1, systemd, off"),
    ({"cgroup_root": "/"}, "cgroup_root must be a path"),
    ({"cgroup_root": "gq/../x"}, "cgroup_root must be a path"),
    ({"job_pids_max": -1}, "job_pids_max must be 0"),
    ({"private_tmp": "yes"}, "private_tmp must be a bool"),
])
def test_bad_isolation_keys_are_refused(table: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_mod.from_dict({"node": table})


def test_configured_backends_that_cannot_work_here_stop_gqnode(tmp_path: Path) -> None:
    """cgroups = "v2" or "systemd" is reachable by configuration; on a host without them (v1
    controllers, no systemd) gqnode refuses to start with the reason; "auto" falls back."""
    _, v2 = cg.host_hierarchies()
    if v2 is not None and "memory" in v2.controllers:
        pytest.skip("this host's cgroup v2 has a memory controller")
    for kind in ("v2", "systemd"):
        cfg = config_mod.from_dict({"node": {"cgroups": kind}}).node
        with pytest.raises(cg.CgroupConfigError, match="cgroup v2|systemd-run"):
            NodeIsolation.configured(cfg, "n1", tmp_path, [], {}, 0, 0)


def test_reports_carry_usage_and_bad_figures_are_left_out() -> None:
    fields = protocol.usage_fields({"max_rss": 5 * M, "cpu_s": 1.5})
    assert fields == {"max_rss": 5 * M, "cpu_s": 1.5}
    assert protocol.usage_fields({"max_rss": -1, "cpu_s": float("nan")}) == {}
    assert protocol.usage_fields({"max_rss": None}) == {}
    frame = protocol.encode(protocol.REPORT, node="n1", seq=1, job_id=1, restart=0,
                            event=protocol.FINISHED, time=1.0, **fields)
    assert protocol.decode(frame)["max_rss"] == 5 * M
    with pytest.raises(ProtocolError, match="max_rss"):
        protocol.decode(protocol.encode(protocol.REPORT, node="n1", seq=1, job_id=1, restart=0,
                                        event=protocol.FINISHED, time=1.0, max_rss=-5))
