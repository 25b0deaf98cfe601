"""End to end on a live cluster: real gqd, two real gqnodes (8 fake GPUs each), real CLI."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import msgpack
import psutil
import pytest
import zmq

from gq import keys, protocol
from tests.conftest import LiveCluster, prepare, running, wait_for

DOCUMENTED_FIELDS = {"id", "name", "user", "state", "reason", "qos", "priority", "nodes",
                     "gpus_per_node", "gpu_type", "time_limit_s", "submit_time", "start_time",
                     "end_time", "exit_code", "node_list", "gpu_ids", "array_job_id",
                     "array_index"}


def test_sixteen_concurrent_one_gpu_jobs_never_share_a_gpu(cluster: LiveCluster) -> None:
    work = cluster.work
    # Each job records its GPU, then waits until all 16 are running at once (a barrier): the
    # test can only pass if the 16 really run concurrently, one per GPU.
    script = f"""#!/bin/sh
echo "$GQ_NODELIST $CUDA_VISIBLE_DEVICES" > {work}/gpu.$GQ_JOB_ID
touch {work}/started.$GQ_JOB_ID
i=0
while [ "$(ls {work} | grep -c '^started[.]')" -lt 16 ]; do
  i=$((i+1)); [ $i -gt 900 ] && exit 1; sleep 0.1
done
"""
    with cluster.client() as c:
        ids = c.submit([cluster.spec(script, gpus=1) for _ in range(16)])
        done = c.wait(ids, timeout_s=120)
    started = sorted(p.name for p in work.glob("started.*"))
    if [j["state"] for j in done] != ["COMPLETED"] * 16:
        pytest.fail("\n".join([*(str((j["id"], j["state"], j["exit_code"], j["start_time"],
                                       j["end_time"], j["node_list"])) for j in done),
                               f"started: {started}", cluster.log_tails("node1")]))
    seen = [tuple((work / f"gpu.{i}").read_text().split()) for i in ids]
    assert len(set(seen)) == 16, f"GPUs shared: {sorted(seen)}"
    assert all(len(gpu.split(",")) == 1 for _, gpu in seen)
    assert {node for node, _ in seen} == {"node1", "node2"}
    # The head's record agrees with what the jobs saw.
    recorded = {(n, str(g)) for j in done for n, gs in j["gpu_ids"].items() for g in gs}
    assert recorded == set(seen)


def test_whole_node_job_gets_an_idle_node_while_small_jobs_pack(cluster: LiveCluster) -> None:
    small = [cluster.submit("--wrap", "sleep 300") for _ in range(3)]
    small_nodes = {cluster.wait_state(i, "RUNNING")["node_list"][0] for i in small}
    assert len(small_nodes) == 1, "best fit should pack 1-GPU jobs onto one node"
    big = cluster.submit("-g", "8", "--wrap", "echo $CUDA_VISIBLE_DEVICES > big.txt")
    job = cluster.wait_state(big, "COMPLETED")
    (node, gpus), = job["gpu_ids"].items()
    assert node not in small_nodes
    assert gpus == list(range(8))
    assert (cluster.work / "big.txt").read_text().strip() == "0,1,2,3,4,5,6,7"
    cluster.gq("cancel", *map(str, small), check=True)


def test_job_past_its_time_limit_ends_timeout(cluster: LiveCluster) -> None:
    job_id = cluster.submit("-t", "2s", "--wrap", "sleep 120")
    job = cluster.wait_state(job_id, "TIMEOUT", "COMPLETED", "FAILED", timeout=40)
    assert job["state"] == "TIMEOUT"
    assert job["time_limit_s"] == 2
    unlimited = cluster.submit("-t", "UNLIMITED", "--wrap", "true")
    assert cluster.wait_state(unlimited, "COMPLETED")["time_limit_s"] == 0


def test_cancel_ends_running_job_and_its_children(cluster: LiveCluster) -> None:
    job_id = cluster.submit("--wrap", "sleep 300 & echo $! > child.pid; wait")
    cluster.wait_state(job_id, "RUNNING")
    pid_file = cluster.work / "child.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the grandchild's pid")
    child = psutil.Process(int(pid_file.read_text()))
    # The forked shell becomes `sleep` only once it has exec'd.
    wait_for(lambda: child.name() == "sleep", "the grandchild to be sleep")
    result = cluster.gq("cancel", str(job_id))
    assert result.returncode == 0, result.stderr
    assert cluster.show(job_id)["state"] == "CANCELLED"
    wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
             "the sleep grandchild to be killed")
    # Its GPU is free again once the node reports the run gone.
    wait_for(lambda: not any(g["job"] for n in cluster.nodes() for g in n["gpus"]),
             "the cancelled job's GPU to be released")
    again = cluster.gq("cancel", str(job_id))
    assert again.returncode == 1 and "already finished" in again.stderr


def test_wait_returns_the_jobs_exit_code(cluster: LiveCluster) -> None:
    result = cluster.gq("submit", "--wait", "--wrap", "exit 7")
    assert result.returncode == 7, result.stderr
    job_id = int(result.stdout.split()[-1])
    assert cluster.show(job_id)["state"] == "FAILED"
    assert cluster.gq("wait", str(job_id)).returncode == 7
    ok = cluster.gq("submit", "--wait", "--wrap", "true")
    assert ok.returncode == 0


def test_output_file_holds_the_jobs_output(cluster: LiveCluster) -> None:
    job_id = cluster.submit("-o", "out.%j.%x.txt", "-J", "greeter", "--wrap",
                            "echo hello from $GQ_JOB_ID; echo oops >&2")
    cluster.wait_state(job_id, "COMPLETED")
    out = cluster.work / f"out.{job_id}.greeter.txt"
    assert out.read_text() == f"hello from {job_id}\noops\n"
    logs = cluster.gq("logs", str(job_id), check=True)
    assert logs.stdout == out.read_text()


def test_job_environment_follows_the_contract(cluster: LiveCluster) -> None:
    job_id = cluster.submit("-g", "2", "-J", "envcheck", "--export", "NONE,FOO=bar",
                            "--wrap", "env > env.txt")
    cluster.wait_state(job_id, "COMPLETED")
    env = dict(line.split("=", 1) for line in (cluster.work / "env.txt").read_text().splitlines()
               if "=" in line)
    assert env["GQ_JOB_ID"] == str(job_id)
    assert env["GQ_JOB_NAME"] == "envcheck"
    assert env["GQ_NUM_NODES"] == "1" and env["GQ_NODE_RANK"] == "0"
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    assert env["GQ_GPUS"] == env["CUDA_VISIBLE_DEVICES"]
    assert env["GQ_RESTART_COUNT"] == "0" and env["GQ_CHECKPOINT_DIR"]
    assert env["FOO"] == "bar"
    assert "XDG_STATE_HOME" not in env, "--export NONE must not copy the submitter's variables"


def test_sbatch_and_gq_directives_are_honoured(cluster: LiveCluster) -> None:
    script = cluster.work / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:2 -t 10\n#SBATCH -J named\n"
                      "#SBATCH -o out.%j\n#SBATCH --partition=train\n#SBATCH --reservation=r1\n"
                      "#GQ --qos pro\necho gpus=$CUDA_VISIBLE_DEVICES\n")
    result = cluster.gq("submit", "--parsable", str(script), check=True)
    # No partitions are configured: the script's runs on every node, with a warning; an
    # sbatch option gq has no use for is named too, not skipped silently.
    assert "partition 'train' is every node" in result.stderr
    assert "--reservation: sbatch's, not used by gq, ignored" in result.stderr
    job_id = int(result.stdout)
    job = cluster.wait_state(job_id, "COMPLETED")
    assert (job["name"], job["gpus_per_node"], job["time_limit_s"], job["qos"],
            job["partition"]) == ("named", 2, 600, "pro", "train")
    assert (cluster.work / f"out.{job_id}").read_text().count(",") == 1


def test_head_killed_after_submit_keeps_the_job(cluster: LiveCluster) -> None:
    blockers = [cluster.submit("-g", "8", "--wrap", "sleep 300") for _ in range(2)]
    for b in blockers:
        cluster.wait_state(b, "RUNNING")
    job_id = cluster.submit("--wrap", "echo survived > survived.txt")
    head = cluster.head_pid()
    assert head is not None
    os.kill(head, signal.SIGKILL)  # right after `gq submit` returned the id
    wait_for(lambda: cluster.head_pid() is None, "gqd to die")
    assert cluster.gq("up").returncode == 0
    assert cluster.head_pid() not in (None, head)
    job = cluster.show(job_id)
    assert job["state"] == "PENDING"
    assert {cluster.show(b)["state"] for b in blockers} == {"RUNNING"}
    # Nodes re-register with the new head and keep their jobs; the queued job then runs.
    wait_for(lambda: all(n["state"] == "UP" for n in cluster.nodes()),
             "the nodes to re-register")
    cluster.gq("cancel", *map(str, blockers), check=True)
    cluster.wait_state(job_id, "COMPLETED")
    assert (cluster.work / "survived.txt").read_text() == "survived\n"


def test_garbage_never_stops_gqd(cluster: LiveCluster) -> None:
    cfg = cluster.config()
    ipc = next(ep for ep in cfg.head.client_endpoints if ep.startswith("ipc://"))
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(ipc)
    bad = [
        b"\xc1\xff garbage",
        msgpack.packb({"v": 99, "type": "ping", "rid": 5}),
        msgpack.packb({"v": protocol.PROTOCOL_VERSION, "type": "launch_missiles", "rid": 6}),
        msgpack.packb({"v": protocol.PROTOCOL_VERSION, "type": "submit", "rid": 7,
                       "jobs": [{"script": 42}]}),
        msgpack.packb([1, 2, 3]),
    ]
    for frame in bad:
        sock.send(frame)
        assert sock.poll(10_000), "gqd did not answer a malformed request"
        reply = msgpack.unpackb(sock.recv(), raw=False)
        assert reply["ok"] is False and reply["error"]
    assert "version" in _reply_text(sock, bad[1])
    assert "launch_missiles" in _reply_text(sock, bad[2])
    # Nodes' socket too: junk, even under a valid node key, is logged and dropped.
    node = ctx.socket(zmq.DEALER)
    node.linger = 0
    node.setsockopt(zmq.IDENTITY, b"node2/junk")
    curve = keys.node_keys(cluster.layout.keys, "node2")
    node.curve_secretkey, node.curve_publickey = curve.secret, curve.public
    node.curve_serverkey = curve.server
    node.connect(cfg.head.node_endpoint)
    node.send(b"not msgpack at all")
    wait_for(lambda: "dropping message from node 'node2'" in cluster.log("gqd"),
             "gqd to log the bad node message")
    sock.send(protocol.encode(protocol.PING, rid=8))
    assert sock.poll(10_000)
    assert msgpack.unpackb(sock.recv(), raw=False)["ok"] is True
    assert cluster.gq("queue").returncode == 0
    sock.close()
    node.close()


def _reply_text(sock: zmq.Socket, frame: bytes) -> str:
    sock.send(frame)
    assert sock.poll(10_000)
    return str(msgpack.unpackb(sock.recv(), raw=False)["error"])


def test_json_output_has_the_documented_fields(cluster: LiveCluster) -> None:
    import json
    job_id = cluster.submit("-J", "jsonjob", "--wrap", "sleep 300")
    cluster.wait_state(job_id, "RUNNING")
    listing = json.loads(cluster.gq("queue", "--json", check=True).stdout)
    assert listing["schema_version"] == 1
    (job,) = [j for j in listing["jobs"] if j["id"] == job_id]
    assert DOCUMENTED_FIELDS <= job.keys()
    assert job["name"] == "jsonjob" and job["state"] == "RUNNING"
    assert job["start_time"].endswith("Z") and job["end_time"] is None
    shown = json.loads(cluster.gq("show", str(job_id), "--json", check=True).stdout)
    assert DOCUMENTED_FIELDS <= shown.keys()
    assert shown["gpu_ids"] == job["gpu_ids"] and len(shown["node_list"]) == 1
    nodes = json.loads(cluster.gq("nodes", "--json", check=True).stdout)["nodes"]
    assert sorted(n["name"] for n in nodes) == ["node1", "node2"]
    assert sum(g["job"] == job_id for n in nodes for g in n["gpus"]) == 1
    cluster.gq("cancel", str(job_id), check=True)


def test_bad_input_on_the_command_line_exits_2_naming_it(cluster: LiveCluster) -> None:
    bad = cluster.gq("submit", "-t", "5x", "--wrap", "true")
    assert bad.returncode == 2 and "'5x'" in bad.stderr and "HH:MM:SS" in bad.stderr
    assert cluster.gq("submit", "--bogus-flag", "--wrap", "true").returncode == 2
    assert cluster.gq("submit", "--gpu-mem", "lots", "--wrap", "true").returncode == 2
    script = cluster.work / "noshebang.sh"
    script.write_text("echo hi\n")
    assert cluster.gq("submit", str(script)).returncode == 2
    refused = cluster.gq("submit", "-q", "platinum", "--wrap", "true")
    assert refused.returncode == 1 and "platinum" in refused.stderr
    assert cluster.gq("show", "999999").returncode == 1
    with cluster.client() as c:
        assert not c.queue(), "nothing refused may have been queued"


def test_gq_up_is_idempotent_and_restarts_only_what_stopped(cluster: LiveCluster) -> None:
    head, node1, node2 = cluster.head_pid(), cluster.node_pid("node1"), cluster.node_pid("node2")
    os.kill(node2, signal.SIGKILL)
    wait_for(lambda: cluster.node_pid("node2") is None, "node2 to die")
    result = cluster.gq("up", check=True)
    assert "node2" in result.stderr and "node1" not in result.stderr and "gqd" not in result.stderr
    assert cluster.head_pid() == head and cluster.node_pid("node1") == node1
    assert cluster.node_pid("node2") not in (None, node2)
    assert "started" not in cluster.gq("up", check=True).stderr


def test_no_head_exits_3_and_says_how_to_start_one(tmp_path: Path) -> None:
    import subprocess
    import sys
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "s"), "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("GQ_CONFIG", None)
    result = subprocess.run([sys.executable, "-m", "gq.cli.main", "queue"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "gq up" in result.stderr


def test_tcp_callers_may_read_but_not_change_the_queue(tmp_path: Path) -> None:
    live = prepare(tmp_path)
    live.configure(lambda cfg: setattr(cfg.auth, "owner", ""))  # a personal one admits no TCP
    with running(live) as cluster:
        _tcp_read_only(cluster)


def _tcp_read_only(cluster: LiveCluster) -> None:
    from gq.client import Client
    from gq.errors import PermissionDenied
    cfg = cluster.config()
    cfg.client.endpoints = [ep for ep in cfg.head.client_endpoints if ep.startswith("tcp://")]
    # Over ipc: the kernel vouches for us. Cancelled below once its script runs (a cancel the
    # instant its shepherd was forked once left it running: test_signal's fork test).
    job_id = cluster.submit("--wrap", "touch tcp-started; sleep 300")
    with Client(cfg) as tcp:
        assert tcp.ping()["proven"] is False
        assert [j["id"] for j in tcp.queue()] == [job_id]
        with pytest.raises(PermissionDenied, match="proven identity"):
            tcp.submit([cluster.spec("#!/bin/sh\ntrue\n")])
        with pytest.raises(PermissionDenied):
            tcp.cancel([job_id])
    assert cluster.show(job_id)["state"] in ("PENDING", "RUNNING")
    wait_for(lambda: (cluster.work / "tcp-started").exists(), "the job's script to run")
    with cluster.client() as local:
        assert local.ping()["proven"] is True
        local.cancel([job_id])


def test_drained_node_gets_no_new_jobs_until_resumed(cluster: LiveCluster) -> None:
    drained = cluster.gq("admin", "drain", "node1", "--reason", "bad fan")
    assert drained.returncode == 0, drained.stderr
    node1 = next(n for n in cluster.nodes() if n["name"] == "node1")
    assert (node1["state"], node1["reason"]) == ("DRAIN", "bad fan")
    first = cluster.submit("--wrap", "sleep 300")
    assert cluster.wait_state(first, "RUNNING")["node_list"] == ["node2"]
    assert cluster.gq("admin", "resume", "node1").returncode == 0
    # Best fit would pack onto node2, so prove node1 is usable again with a whole-node job.
    big = cluster.submit("-g", "8", "--wrap", "true")
    assert cluster.wait_state(big, "COMPLETED")["node_list"] == ["node1"]
    assert cluster.gq("admin", "drain", "nosuchnode", "--reason", "x").returncode == 1
    cluster.gq("cancel", str(first), check=True)


def test_down_cancels_running_jobs_without_starting_queued_ones(cluster: LiveCluster) -> None:
    from tests.conftest import lingering
    running = [cluster.submit("-g", "8", "--wrap", "sleep 300") for _ in range(2)]
    for job_id in running:
        cluster.wait_state(job_id, "RUNNING")
    queued = cluster.submit("--wrap", "touch started.marker")
    result = cluster.gq("down", check=True)
    assert "cancelled 2 running" in result.stderr
    assert cluster.head_pid() is None
    assert not lingering(cluster.root), "gq down left processes behind"
    assert not (cluster.work / "started.marker").exists(), "a queued job started during down"
    cluster.gq("up", check=True)
    assert cluster.wait_state(queued, "COMPLETED")["restart_count"] == 0
    assert (cluster.work / "started.marker").exists()
    assert {cluster.show(j)["state"] for j in running} == {"CANCELLED"}


def test_down_waits_for_a_job_cancelled_just_before(cluster: LiveCluster) -> None:
    """A cancelled job is CANCELLED at once but lives until its node has reaped it: `gq down`
    right after the cancel must still wait for it (its processes outlived the cluster)."""
    from tests.conftest import lingering
    # Its TERM trap outlasts the 3 s `lingering` allows a shepherd to exit in, not the node's
    # kill grace (10 s): only a `down` that waited for it finds nothing left.
    slow = cluster.submit("--wrap", "trap 'sleep 8; exit 0' TERM; sleep 300 & wait")
    cluster.wait_state(slow, "RUNNING")
    cluster.gq("cancel", str(slow), check=True)
    assert cluster.show(slow)["state"] == "CANCELLED"
    cluster.gq("down", check=True)
    assert not lingering(cluster.root, within_s=3.0), "gq down left a cancelled job's processes"
    cluster.gq("up", check=True)


def test_gqnode_killed_and_restarted_reports_true_exit_codes_once(cluster: LiveCluster) -> None:
    # Jobs on node1 end at different times; gqnode is SIGKILLed before any ends, and restarted
    # after some have ended: all must be reported with their own exit codes, none run twice.
    # Their clocks start at a file the test writes once gqnode is dead, so a slow submit on a
    # busy machine cannot let one end before the kill.
    ends = {1: 3, 2: 0, 4: 7, 30: 0}  # seconds -> exit code
    ids = {}
    for secs, code in ends.items():
        ids[secs] = cluster.submit("--wrap", f"echo run >> runs.$GQ_JOB_ID; "
                                   f"while [ ! -e go ]; do sleep 0.05; done; sleep {secs}; exit {code}")
    for job_id in ids.values():
        assert cluster.wait_state(job_id, "RUNNING")["node_list"] == ["node1"]
    wait_for(lambda: all((cluster.work / f"runs.{i}").exists() for i in ids.values()),
             "every job to begin")
    os.kill(cluster.node_pid("node1"), signal.SIGKILL)
    (cluster.work / "go").touch()
    wait_for(lambda: cluster.show(ids[4])["state"] == "RUNNING" and
             cluster.run_ended("node1", ids[4]), "the 4 s job to end unseen",
             timeout=30)
    assert cluster.gq("up").returncode == 0
    for secs, code in ends.items():
        if secs == 30:
            continue
        job = cluster.wait_state(ids[secs], "COMPLETED", "FAILED")
        assert job["exit_code"] == code, (secs, job)
    assert cluster.show(ids[30])["state"] == "RUNNING", "the long job was re-adopted, not lost"
    cluster.gq("cancel", str(ids[30]), check=True)
    cluster.wait_state(ids[30], "CANCELLED")
    for job_id in ids.values():
        assert (cluster.work / f"runs.{job_id}").read_text() == "run\n", "a job ran twice"



def test_gq_up_gives_an_older_personal_config_the_settings_it_lacks(tmp_path) -> None:
    # A gq.toml from before keys, owner and metrics existed: without them gqd would look for
    # keys in /etc/gq/keys and bind the system metrics port.
    from gq import config as config_mod
    from gq.cluster import Layout, write_config
    layout = Layout(root=tmp_path / "state", runtime=tmp_path / "run")
    cfg = write_config(layout)
    text = config_mod.to_toml(cfg)
    old = "\n".join(line for line in text.splitlines()
                    if not line.startswith(("key_dir", "owner", "allow_root_jobs",
                                            "metrics_addr")))
    assert "key_dir" not in old and "metrics_addr" not in old and "owner" not in old
    layout.config.write_text(old)
    upgraded = write_config(layout)
    assert upgraded.auth.key_dir == str(layout.keys)
    assert upgraded.head.metrics_addr == "127.0.0.1:0"
    assert upgraded.auth.owner == cfg.auth.owner
    # Written back, and what the file did set is kept.
    again = config_mod.load(layout.config)
    assert again.auth.key_dir == str(layout.keys)
    assert again.head.node_endpoint == cfg.head.node_endpoint
