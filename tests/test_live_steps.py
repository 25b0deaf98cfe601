"""Job steps (issue 15, Done when 2), live: a batch script runs once, on its job's first node,
and `srun` in it starts tasks on every node of the allocation through gqd, each with its
SLURM_PROCID, SLURM_LOCALID and GPUs; their output reaches the job's file; a step's status is
its worst task's; --kill-on-bad-exit ends the rest; `gq cancel` kills every task on every
node; steps are listed by `gq history` as JOBID.STEP.

Each test runs on two clusters: two gqnodes on one host, and gqd with one gqnode on the host
and the other gqnode in a network namespace of its own (joined by a veth pair, as in the
partition faults), so that step orders and reports cross a real network."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gq import config as config_mod
from gq import keys
from tests.conftest import LiveCluster, node_in_netns, prepare, running, wait_for
from tests.faults.test_partition import Net, net  # noqa: F401  (the namespace fixture)

#: The gqnode in the network namespace.
NS_NODE = "nsnode"


@pytest.fixture(params=["one host", "two network namespaces"])
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LiveCluster, list[str]]]:
    """A live cluster of two 8-GPU nodes, and their names in rank order."""
    if request.param == "one host":
        with running(prepare(tmp_path)) as live:
            yield live, ["node1", "node2"]
        return
    ns: Net = request.getfixturevalue("net")
    live = prepare(tmp_path)

    def reachable_from_the_namespace(cfg: config_mod.Config) -> None:
        port = cfg.head.node_endpoint.rsplit(":", 1)[1]
        cfg.head.node_endpoint = cfg.node.head = f"tcp://{ns.host_addr}:{port}"

    live.configure(reachable_from_the_namespace)
    keys.ensure(live.layout.keys, [NS_NODE])  # `gq up` makes keys only for its own nodes
    with running(live, nodes=1), live.layout.log(NS_NODE).open("ab") as log:
        other = node_in_netns(live, ns.ns, NS_NODE, ns.ns_addr, log)
        try:
            wait_for(lambda: any(n["name"] == NS_NODE and n["state"] == "UP"
                                 for n in live.nodes()), f"{NS_NODE} to register")
            yield live, ["node1", NS_NODE]
        finally:
            live.gq("down", timeout=90)  # stops the namespace's gqnode too (its pid file)
            other.wait(timeout=30)

#: One line a task: what Slurm (and torch) told it.
TASK_LINE = ('echo "task $SLURM_PROCID local $SLURM_LOCALID node $SLURM_NODEID '
             'host $SLURMD_NODENAME gpus $CUDA_VISIBLE_DEVICES step $SLURM_STEP_ID '
             'rank $RANK of $WORLD_SIZE ntasks $SLURM_NTASKS"')
TASK_RE = re.compile(r"^task (\d) local (\d) node (\d) host (\S+) gpus (\S+) step (\d+) "
                     r"rank (\d) of (\d) ntasks (\d)$", re.M)


def _script(cluster: LiveCluster, name: str, body: str) -> Path:
    path = cluster.work / name
    path.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\n"
                    "#SBATCH --gpus-per-task=1\n#SBATCH -t 5:00\n"
                    f"#SBATCH -o {cluster.work}/{name}-%j.out\n{body}")
    return path


def _submit(cluster: LiveCluster, script: Path) -> int:
    out = cluster.gq("submit", "--parsable", str(script), check=True)
    return int(out.stdout.strip().split(";")[0])


def test_srun_starts_four_tasks_on_two_nodes_with_their_ranks_and_gpus(
        nodes: tuple[LiveCluster, list[str]]) -> None:
    cluster, names = nodes
    script = _script(cluster, "ranks", f"""
echo "batch on $SLURMD_NODENAME"
srun -n 4 --ntasks-per-node 2 --gpus-per-task 1 sh -c '{TASK_LINE}'
echo "srun=$?"
srun -N 2 -n 2 sh -c 'echo "second $SLURM_STEP_ID on $SLURMD_NODENAME"'
srun -l -n 12 --ntasks-per-node 6 --gpus-per-task 0 sh -c 'printf "%s labelled\\n" $SLURM_PROCID'
srun -n 2 -o per-%j-%s-%t-%n.out sh -c 'echo "own $SLURM_PROCID"'
srun -n 2 sh -c 'echo "cgroup $SLURM_PROCID $(grep -o "job_[0-9.]*/step_[0-9a-z]*" /proc/self/cgroup | head -n 1)"'
echo "batch cgroup $(grep -o "job_[0-9.]*/step_[0-9a-z]*" /proc/self/cgroup | head -n 1)"
echo "ip=$(srun --nodes=1 --ntasks=1 -w {names[1]} sh -c 'echo $SLURMD_NODENAME.$SLURM_NODEID')"
srun -o "/tmp/$(printf '%%N%.0s' $(seq 1500))" true; echo "long=$?"
""")
    job = _submit(cluster, script)
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    text = (cluster.work / f"ranks-{job}.out").read_text()
    assert done["state"] == "COMPLETED", text
    # The script ran once, on the first node; its own lines and the tasks' all in one file.
    assert text.count("batch on ") == 1 and f"batch on {names[0]}\n" in text, text
    assert "srun=0\n" in text
    tasks = [m.groups() for m in TASK_RE.finditer(text)]
    assert sorted(int(t[0]) for t in tasks) == [0, 1, 2, 3], text
    by_proc = {int(t[0]): t for t in tasks}
    for procid, (_, local, node, host, gpus, step, rank, world, ntasks) in by_proc.items():
        assert int(local) == procid % 2 and int(node) == procid // 2, by_proc
        assert host == names[procid // 2] and step == "0" and rank == str(procid)
        assert (world, ntasks) == ("4", "4")
        assert len(gpus.split(",")) == 1, "one GPU a task"
    # Disjoint GPUs: the two tasks of a node never share one, and each is one of the job's.
    alloc = done["gpu_ids"]
    for node in names:
        held = [t[4] for t in tasks if t[3] == node]
        assert len(held) == 2 and len(set(held)) == 2, tasks
        assert {int(g) for g in held} <= set(alloc[node]) and len(alloc[node]) == 2, alloc
    assert all(f"second 1 on {node}\n" in text for node in names), text
    # srun -l: each line with its task's id, padded to the widest (as Slurm's).
    labelled = sorted(line for line in text.splitlines() if line.endswith(" labelled"))
    assert labelled == [f"{i:>2}: {i} labelled" for i in range(12)], text
    # Where gqnode confines jobs, each step is a child cgroup of the job's, beside the script's.
    if "jobs are confined" in cluster.log(names[1]):
        assert f"cgroup 0 job_{job}.0/step_4\n" in text and f"cgroup 1 job_{job}.0/step_4\n" \
            in text and f"batch cgroup job_{job}.0/step_batch\n" in text, text
    # srun -w: on the node named (torchrun scripts find their head node's address so), its
    # SLURM_NODEID its place in the step (Slurm's).
    assert f"ip={names[1]}.0\n" in text, text
    assert not list(cluster.work.glob(".srun-*")), "srun removes its relay files"
    # srun -o: the step's own files, %s the step, %t the task and %n its node.
    for task in (0, 1):
        assert (cluster.work / f"per-{job}-3-{task}-{task}.out").read_text() == f"own {task}\n"
    # An output pattern gqd expands past what a node takes (%N: the first node's name): srun
    # is refused at once, not left waiting for a step no node would start.
    assert "srun: error:" in text and "the job's nodes would refuse this step" in text, text
    assert re.search(r"^long=[1-9][0-9]*$", text, re.M), text
    # gq submit --each-node: the command once on each node, as a step.
    out = cluster.gq("submit", "--parsable", "-N", "2", "-g", "0", "--each-node", "-o",
                     f"{cluster.work}/each-%j.out", "--wrap",
                     'echo "each $SLURM_PROCID on $SLURMD_NODENAME"', check=True)
    each = int(out.stdout.strip())
    assert cluster.wait_state(each, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    lines = sorted((cluster.work / f"each-{each}.out").read_text().splitlines())
    assert lines == [f"each {i} on {node}" for i, node in enumerate(names)], lines


def test_a_failing_task_fails_the_step_and_kill_on_bad_exit_ends_the_others(
        nodes: tuple[LiveCluster, list[str]]) -> None:
    cluster, names = nodes
    script = _script(cluster, "bad", """
srun sh -c 'if [ "$SLURM_PROCID" = 3 ]; then exit 7; fi; sleep 0.5; echo "done $SLURM_PROCID"'
echo "plain=$?"
start=$(date +%s)
srun -K sh -c 'if [ "$SLURM_PROCID" = 2 ]; then sleep 1; exit 5; fi
               echo "k-up $SLURM_PROCID"; sleep 120; echo "k-survived $SLURM_PROCID"'
echo "kill=$? after $(( $(date +%s) - start ))s"
exit 0
""")
    job = _submit(cluster, script)
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    text = (cluster.work / f"bad-{job}.out").read_text()
    assert done["state"] == "COMPLETED", text
    # Without -K the others run to their end; the step's status is the failing task's.
    assert sorted(re.findall(r"^done (\d)$", text, re.M)) == ["0", "1", "2"], text
    assert "plain=7\n" in text, text
    # With -K the failing task ends the step on both nodes long before the others' sleep.
    m = re.search(r"^kill=(\d+) after (\d+)s$", text, re.M)
    assert m and int(m[1]) == 5 and int(m[2]) < 60, text
    assert sorted(re.findall(r"^k-up (\d)$", text, re.M)) == ["0", "1", "3"], text
    assert "k-survived" not in text
    history = cluster.gq("history", "-j", str(job), "-p", check=True).stdout
    rows = {line.split("|")[0]: line.split("|") for line in history.splitlines()[1:]}
    assert set(rows) == {str(job), f"{job}.0", f"{job}.1"}, history
    assert rows[f"{job}.0"][5:7] == ["FAILED", "7"], history
    assert rows[f"{job}.1"][5:7] == ["FAILED", "5"], history
    assert rows[f"{job}.0"][12] == ",".join(names)
    shown = cluster.gq("show", str(job), check=True).stdout
    assert f"Steps={job}.0:FAILED:7,{job}.1:FAILED:5" in shown, shown
    assert [s["id"] for s in cluster.show(job)["steps"]] == [f"{job}.0", f"{job}.1"]
    sacct = _sacct(cluster, "-j", str(job), "-P", "--format=JobID,State,ExitCode,NodeList")
    assert sacct.splitlines()[1:] == [
        f"{job}|COMPLETED|0:0|{_hostlist(names)}", f"{job}.0|FAILED|7:0|{_hostlist(names)}",
        f"{job}.1|FAILED|5:0|{_hostlist(names)}"], sacct
    assert _sacct(cluster, "-j", str(job), "-X", "-P", "-n", "-o", "JobID").split() == [str(job)]


def test_cancel_kills_every_task_on_every_node(nodes: tuple[LiveCluster, list[str]]) -> None:
    cluster, names = nodes
    pids = cluster.work / "pids"
    pids.mkdir()
    script = _script(cluster, "cancel", f"""
trap 'echo "the script got USR1"' USR1  # the script is signalled too (gq's default)
srun sh -c 'trap "touch {pids}/usr1.$SLURM_PROCID" USR1
           echo $$ > {pids}/$SLURM_PROCID.$SLURMD_NODENAME; while :; do sleep 0.1; done'
""")
    job = _submit(cluster, script)
    files = wait_for(lambda: (found := sorted(pids.glob("*.*node*"))) and len(found) == 4
                     and all(f.read_text().endswith("\n") for f in found) and found,
                     "the four tasks to start")
    assert [f.name for f in files] == [f"{i}.{names[i // 2]}" for i in range(4)]
    tasks = [int(f.read_text()) for f in files]
    assert all(psutil.pid_exists(p) for p in tasks)
    # gq cancel --signal reaches every task of the job's steps, on every node; they go on.
    cluster.gq("cancel", "--signal", "USR1", str(job), check=True)
    wait_for(lambda: len(list(pids.glob("usr1.*"))) == 4, "every task to get SIGUSR1")
    assert all(_alive(p) for p in tasks) and cluster.show(job)["state"] == "RUNNING"
    cluster.gq("cancel", str(job), check=True)
    cluster.wait_state(job, "CANCELLED")
    wait_for(lambda: not any(_alive(p) for p in tasks), "every task to be killed")
    history = cluster.gq("history", "-j", str(job), "-p", check=True).stdout
    assert f"\n{job}.0|sh|" in history and "|CANCELLED|" in history, history


def _sacct(cluster: LiveCluster, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c",
                          "import sys; from gq.slurm.sacct import main; sys.exit(main())", *args],
                         env=cluster.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _hostlist(names: list[str]) -> str:
    from gq.hostlist import compress
    return compress(names)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_srun_outside_a_job_runs_in_a_job_of_its_own(cluster: LiveCluster) -> None:
    """As Slurm's srun makes an allocation (`gq run`, tests/test_live_interactive.py)."""
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("SLURM_", "GQ_JOB"))}
    out = subprocess.run([sys.executable, "-c",
                          "import sys; from gq.slurm.srun import main; sys.exit(main())",
                          "sh", "-c", "echo in $SLURM_JOB_ID; exit 6"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 6 and re.fullmatch(r"in \d+\n", out.stdout), out.stderr


def test_a_step_outlives_a_restart_of_gqd(cluster: LiveCluster) -> None:
    go = cluster.work / "go"
    script = _script(cluster, "restart", f"""
srun sh -c 'touch {cluster.work}/up.$SLURM_PROCID; while [ ! -e {go} ]; do sleep 0.1; done
            exit $(( SLURM_PROCID == 2 ? 4 : 0 ))'
echo "srun=$?"
""")
    job = _submit(cluster, script)
    wait_for(lambda: len(list(cluster.work.glob("up.*"))) == 4, "the four tasks to start")
    head = cluster.head_pid()
    assert head is not None
    os.kill(head, signal.SIGKILL)
    wait_for(lambda: cluster.head_pid() is None, "gqd to die")
    assert cluster.gq("up").returncode == 0, cluster.log("gqd")
    go.touch()
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    text = (cluster.work / f"restart-{job}.out").read_text()
    assert done["state"] == "COMPLETED" and "srun=4\n" in text, text
    history = cluster.gq("history", "-j", str(job), "-p", check=True).stdout
    assert f"\n{job}.0|sh|" in history and "|FAILED|4|" in history, history


def test_a_step_outlives_a_restart_of_a_gqnode(cluster: LiveCluster) -> None:
    go = cluster.work / "go"
    script = _script(cluster, "noderestart", f"""
srun sh -c 'touch {cluster.work}/up.$SLURM_PROCID; while [ ! -e {go} ]; do sleep 0.1; done
            echo "end $SLURM_PROCID"; exit $(( SLURM_PROCID == 3 ? 6 : 0 ))'
echo "srun=$?"
""")
    job = _submit(cluster, script)
    wait_for(lambda: len(list(cluster.work.glob("up.*"))) == 4, "the four tasks to start")
    pid = cluster.node_pid("node2")
    assert pid is not None
    os.kill(pid, signal.SIGTERM)  # gqnode stops; its jobs and steps run on
    wait_for(lambda: cluster.node_pid("node2") is None, "node2's gqnode to stop")
    assert cluster.gq("up").returncode == 0, cluster.log("node2")
    wait_for(lambda: "adopted 1 running jobs" in cluster.log("node2"), "node2 to adopt its run")
    go.touch()
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    text = (cluster.work / f"noderestart-{job}.out").read_text()
    assert done["state"] == "COMPLETED" and "srun=6\n" in text, text
    assert sorted(re.findall(r"^end (\d)$", text, re.M)) == ["0", "1", "2", "3"], text


def test_a_step_order_a_node_missed_is_sent_again(cluster: LiveCluster) -> None:
    go = cluster.work / "go"
    script = _script(cluster, "missed", f"""
while [ ! -e {go} ]; do sleep 0.1; done
srun -n 2 sh -c 'echo "task $SLURM_PROCID on $SLURMD_NODENAME"'
echo "srun=$?"
""")
    job = _submit(cluster, script)
    cluster.wait_state(job, "RUNNING")
    pid = cluster.node_pid("node2")
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: cluster.node_pid("node2") is None, "node2's gqnode to stop")
    go.touch()  # srun asks for the step while node2's gqnode is away: its order is lost
    wait_for(lambda: "unreachable" in cluster.log("gqd") or "step 0" in cluster.log("gqd"),
             "gqd to send the step")
    assert cluster.gq("up").returncode == 0, cluster.log("node2")
    try:
        done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    except pytest.fail.Exception as exc:  # seen once on a loaded host: say what each side did
        pytest.fail(f"{exc}\n{cluster.log_tails('gqd', 'node1', 'node2')}")
    text = (cluster.work / f"missed-{job}.out").read_text()
    assert done["state"] == "COMPLETED" and "srun=0\n" in text, text
    assert "task 0 on node1\n" in text and "task 1 on node2\n" in text, text
    assert text.count("task 1 on node2") == 1, "the resent order started the task once"


def test_the_time_limit_ends_every_task_on_every_node(cluster: LiveCluster) -> None:
    pids = cluster.work / "pids"
    pids.mkdir()
    script = _script(cluster, "limit", f"""
srun sh -c 'echo $$ > {pids}/$SLURM_PROCID; exec sleep 300'
""")
    out = cluster.gq("submit", "--parsable", "-t", "0:04", str(script), check=True)
    job = int(out.stdout.strip())
    files = wait_for(lambda: (found := sorted(pids.iterdir())) and len(found) == 4
                     and all(f.read_text().endswith("\n") for f in found) and found,
                     "the four tasks to start")
    tasks = [int(f.read_text()) for f in files]
    assert cluster.wait_state(job, "TIMEOUT", "COMPLETED", "FAILED")["state"] == "TIMEOUT"
    wait_for(lambda: not any(_alive(p) for p in tasks), "every task to be killed")
    history = cluster.gq("history", "-j", str(job), "-p", check=True).stdout
    assert f"\n{job}.0|sh|" in history and "|CANCELLED|" in history, history


def test_the_jobs_signal_before_its_limit_reaches_every_task(
        nodes: tuple[LiveCluster, list[str]]) -> None:
    cluster, names = nodes
    marks = cluster.work / "marks"
    marks.mkdir()
    script = _script(cluster, "warned", f"""
trap 'echo "the script got USR1"' USR1
srun sh -c 'trap "touch {marks}/usr1.$SLURM_PROCID.$SLURMD_NODENAME" USR1
            while :; do sleep 0.1; done'
""")
    out = cluster.gq("submit", "--parsable", "-t", "1:00", "--signal", "USR1@57", str(script),
                     check=True)
    job = int(out.stdout.strip())
    got = wait_for(lambda: (found := sorted(p.name for p in marks.iterdir())) and
                   len(found) == 4 and found, "every task to get the job's --signal")
    assert got == [f"usr1.{i}.{names[i // 2]}" for i in range(4)]
    assert cluster.show(job)["state"] == "RUNNING", "the signal alone ends nothing"
    cluster.gq("cancel", str(job), check=True)
    cluster.wait_state(job, "CANCELLED")
