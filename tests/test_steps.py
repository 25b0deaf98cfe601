"""Job steps without a cluster: the layout of a step's tasks (Slurm's block distribution within
an allocation), a task's environment, srun's options, and the step messages' checks."""

from __future__ import annotations

import pytest

from gq import protocol, steps, stepwire
from gq.errors import ProtocolError, RefusedError
from gq.slurm import srun
from gq.slurm.common import Failure
from tests.messages import message

NODES = ["n1", "n2"]
GPUS = {"n1": [0, 1, 2, 3], "n2": [4, 5, 6, 7]}


def _shape(parts: list[steps.NodePart]) -> list[list[tuple[int, int, tuple[int, ...]]]]:
    return [[(t.procid, t.localid, t.gpus) for t in p.tasks] for p in parts]


def test_four_tasks_two_a_node_get_one_gpu_each_in_block_order() -> None:
    parts = steps.layout(NODES, GPUS, ntasks=4, nodes=None, ntasks_per_node=2, gpus_per_task=1)
    assert [p.node for p in parts] == NODES and [p.node_id for p in parts] == [0, 1]
    assert _shape(parts) == [[(0, 0, (0,)), (1, 1, (1,))], [(2, 0, (4,)), (3, 1, (5,))]]


@pytest.mark.parametrize("kw, want", [
    # No -n, -N or --ntasks-per-node: one task a node, sharing the node's GPUs.
    ({}, [[(0, 0, (0, 1, 2, 3))], [(1, 0, (4, 5, 6, 7))]]),
    # -n 3 on two nodes: 2 and 1 (the spare ones last).
    ({"ntasks": 3}, [[(0, 0, (0, 1, 2, 3)), (1, 1, (0, 1, 2, 3))], [(2, 0, (4, 5, 6, 7))]]),
    # -n 1: one node only.
    ({"ntasks": 1}, [[(0, 0, (0, 1, 2, 3))]]),
    # -N 1 --ntasks-per-node 2 --gpus-per-task 2.
    ({"nodes": 1, "ntasks_per_node": 2, "gpus_per_task": 2}, [[(0, 0, (0, 1)), (1, 1, (2, 3))]]),
    # -w n2 -n 1: that node only.
    ({"only": ["n2"], "ntasks": 1}, [[(0, 0, (4, 5, 6, 7))]]),
])
def test_slurms_defaults_inside_an_allocation(kw: dict, want: list) -> None:
    args = {"ntasks": None, "nodes": None, "ntasks_per_node": None, "gpus_per_task": None, **kw}
    assert _shape(steps.layout(NODES, GPUS, **args)) == want


@pytest.mark.parametrize("kw, why", [
    ({"nodes": 3}, "the step may use 2 node"),
    ({"only": ["n3"]}, "n3 not in the job's nodes"),
    ({"only": ["n2"], "nodes": 2}, "may use 1 node"),
    ({"ntasks": 5, "ntasks_per_node": 2}, "do not fit"),
    ({"ntasks": 4, "gpus_per_task": 3}, "need 6 GPUs on n1"),
    ({"ntasks": 0}, "at least 1"),
    ({"ntasks": steps.MAX_TASKS + 1}, "at most"),
])
def test_a_step_the_allocation_cannot_hold_is_refused(kw: dict, why: str) -> None:
    args = {"ntasks": None, "nodes": None, "ntasks_per_node": None, "gpus_per_task": None, **kw}
    with pytest.raises(RefusedError, match=why):
        steps.layout(NODES, GPUS, **args)


def test_a_step_on_named_nodes_numbers_them_from_0_as_slurm() -> None:
    parts = steps.layout(NODES, GPUS, ntasks=None, nodes=None, ntasks_per_node=None,
                         gpus_per_task=None, only=["n2"])
    assert [(p.node, p.node_id) for p in parts] == [("n2", 0)]


def test_a_tasks_environment_names_its_ranks_node_and_gpus() -> None:
    parts = steps.layout(NODES, GPUS, ntasks=4, nodes=None, ntasks_per_node=2, gpus_per_task=2)
    assert steps.from_wire(steps.to_wire(parts)) == parts
    env = steps.task_env(parts, parts[1], parts[1].tasks[1], job_id=42, step_id=3,
                         master_addr="10.0.0.1", cpus_per_task=4)
    assert {k: env[k] for k in (
        "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_NTASKS",
        "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "CUDA_VISIBLE_DEVICES", "RANK",
        "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "SLURMD_NODENAME", "SLURM_CPUS_PER_TASK",
        "SLURM_GTIDS")} == {
        "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_ID": "3",
        "SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "CUDA_VISIBLE_DEVICES": "6,7", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1", "SLURMD_NODENAME": "n2", "SLURM_CPUS_PER_TASK": "4",
        "SLURM_GTIDS": "2,3"}
    assert steps.worst([0, 3, None, 1]) == 137 and steps.worst([]) == 0


@pytest.mark.parametrize("argv, kill, command", [
    (["-K", "prog", "-K"], True, ["prog", "-K"]),
    (["-K1", "-n", "4", "prog"], True, ["prog"]),
    (["--kill-on-bad-exit=0", "prog"], False, ["prog"]),
    (["--kill-on-bad-exit", "--", "prog", "x"], True, ["prog", "x"]),
    (["-n", "2", "--gpu-bind=closest", "-l", "python", "-u", "t.py"], False,
     ["python", "-u", "t.py"]),
    (["--wait=60", "--kill-on-bad-exit=1", "--jobid", "9", "-W", "5", "bash", "-c", "x"], True,
     ["bash", "-c", "x"]),
    # Real scripts' srun lines: the old `--cpu_bind` spelling, and sbatch's options srun
    # takes too (a NERSC script's `srun -n 4 -c 32 --cpu_bind=cores -G 4 --gpu-bind=single:1`).
    (["-n", "4", "-c", "32", "--cpu_bind=cores", "-G", "4", "--gpu-bind=single:1", "python"],
     False, ["python"]),
    (["--cpus-per-gpu", "8", "--hint=nomultithread", "--mem_bind=local", "--signal=USR1@60",
      "--ntasks-per-gpu=1", "-C", "gpu", "run.sh"], False, ["run.sh"]),
])
def test_srun_reads_slurms_option_forms(argv: list[str], kill: bool, command: list[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    p = srun.parser()
    fields = srun.request(p.parse_args(srun._options(p, argv)))
    assert (fields["job_id"], fields["kill_on_bad_exit"], fields["argv"]) == (9, kill, command)


def test_srun_takes_tasks_per_node_for_ntasks_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    p = srun.parser()
    fields = srun.request(p.parse_args(["--tasks-per-node=2", "-N", "2", "true"]))
    assert fields["ntasks_per_node"] == 2, fields


def test_srun_takes_the_jobs_task_count_and_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SECRET", "x")
    p = srun.parser()
    fields = srun.request(p.parse_args(["--export=NONE,A=1", "-N", "1-1", "true"]))
    assert (fields["ntasks"], fields["nodes"]) == (None, 1)  # -N given: not the job's -n
    assert fields["env"]["A"] == "1" and "SECRET" not in fields["env"]
    assert fields["env"]["SLURM_JOB_ID"] == "9"
    assert srun.request(p.parse_args(["true"]))["ntasks"] == 8
    assert srun.request(p.parse_args(["-w", "n[1-2]", "true"]))["nodelist"] == ["n1", "n2"]
    # The job's --gpus-per-task and -c are srun's defaults (Slurm's input variables).
    monkeypatch.setenv("SLURM_GPUS_PER_TASK", "a100:1")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    fields = srun.request(p.parse_args(["true"]))
    assert (fields["gpus_per_task"], fields["cpus_per_task"]) == (1, 4)
    assert srun.request(p.parse_args(["--gpus-per-task", "2", "-c", "1", "true"]))[
        "gpus_per_task"] == 2
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("GQ_JOB_ID", raising=False)
    with pytest.raises(Failure, match="no job allocation"):
        srun.request(p.parse_args(["true"]))


@pytest.mark.parametrize("kind, field, value", [
    (stepwire.STEP_LAUNCH, "env", {"A=B": "x"}),
    (stepwire.STEP_LAUNCH, "env", {"A": 1}),
    (stepwire.STEP_LAUNCH, "env", {"A": "x\0y"}),
    (stepwire.STEP_LAUNCH, "argv", []),
    (stepwire.STEP, "env", {"": "x"}),
    (stepwire.STEP, "layout", [{"node": "n1", "node_id": 0, "tasks": [[0, 0, [0]], 1]}]),
])
def test_step_messages_refuse_what_no_process_could_take(kind: str, field: str,
                                                         value: object) -> None:
    import msgpack
    frame = msgpack.packb(message(kind, **{field: value}), use_bin_type=True)
    with pytest.raises(ProtocolError):
        protocol.decode(frame)
    assert protocol.decode(msgpack.packb(message(kind), use_bin_type=True))["type"] == kind
    with pytest.raises(ProtocolError):
        if kind == stepwire.STEP:  # gqnode's own reading: the typed Step
            protocol.from_head(frame)
        else:
            raise ProtocolError("a client request: decoded as a map only")


def test_a_step_order_reaches_the_step_shepherd_as_gqd_made_it(tmp_path) -> None:
    """gqd's Step, through the wire (gqnode's from_head) and the step's order file, is the
    same Step; its layout is the one laid out. A step report keeps its step through the
    outbox's wire form; a run's own report carries none."""
    from gq import messages
    from gq.head.orders import Order
    from gq.node import stepshepherd
    parts = steps.layout(NODES, GPUS, ntasks=4, nodes=None, ntasks_per_node=2, gpus_per_task=1)
    order = messages.Step(
        job_id=7, restart=1, step=3, argv=("python", "train.py"), env={"A": "1"}, cwd="/tmp",
        layout=tuple(steps.to_wire(parts)), stdout="/tmp/o", stderr="/tmp/e",
        kill_on_bad_exit=True, master_addr="n1", grace_s=2.0, label=True)
    got = protocol.from_head(Order("n2", order).encode())
    assert got == order and steps.from_wire(list(got.layout)) == parts
    stepshepherd.write_order(tmp_path, got, "n2")
    assert stepshepherd.read_order(tmp_path) == (order, "n2")
    kill = protocol.from_head(Order("n2", messages.StepKill(7, 1, 3, "KILL")).encode())
    assert kill == messages.StepKill(7, 1, 3, "KILL")
    ended = messages.Report(node="n2", seq=0, job_id=7, restart=1, event=messages.STEP_ENDED,
                            time=1.0, exit_code=3, step=3)
    assert messages.Report.from_wire({**ended.wire(), "seq": 5}).step == 3
    assert protocol.from_node(protocol.encode_message(ended)) == ended
    run = messages.Report(node="n2", seq=0, job_id=7, restart=1, event=messages.FINISHED,
                          time=1.0)
    assert "step" not in run.wire()


def test_a_task_that_cannot_start_takes_the_started_ones_with_it(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second task's output file cannot be made (srun -o with %t): the node's part of the
    step fails to start, and the first task, running already, is killed with it rather than
    left running with no shepherd watching it."""
    import os
    import subprocess

    from gq import messages
    from gq.node import stepshepherd
    from gq.node.runfiles import RunOrder
    (tmp_path / "1").write_text("")  # task 1's output directory: a file
    parts = steps.layout(["n1"], {"n1": []}, ntasks=2, nodes=None, ntasks_per_node=None,
                         gpus_per_task=None)
    order = messages.Step(
        job_id=1, restart=0, step=0, argv=("sleep", "60"), env={"PATH": os.environ["PATH"]},
        cwd=str(tmp_path), layout=tuple(steps.to_wire(parts)), stdout=f"{tmp_path}/%t/out",
        stderr=f"{tmp_path}/%t/out")
    spec = messages.RunSpec("", uid=os.geteuid(), gid=os.getegid(), cwd=str(tmp_path))
    launch = messages.Launch(1, 0, spec, (), 0, ("n1",), 0, "/dev/null", "/dev/null",
                             messages.ArrayTask())
    started: list[subprocess.Popen[bytes]] = []

    class Recorded(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[call-overload]
            started.append(self)

    monkeypatch.setattr(stepshepherd.subprocess, "Popen", Recorded)
    with pytest.raises(OSError):
        stepshepherd._start(order, "n1", RunOrder(launch, {}))
    alive = [p for p in started if p.poll() is None]
    for proc in alive:
        proc.kill()
        proc.wait()
    assert len(started) == 1 and not alive, started


def test_a_steps_output_pattern_names_the_job_the_step_and_leaves_task_and_node() -> None:
    """srun -o: %J is job.step in a step (the batch script's is the job id alone), %s the
    step; %t and %n are the node's to fill, per task."""
    from gq.head.steps import Steps
    from gq.model import Job, JobSpec
    job = Job(id=42, spec=JobSpec(script="true", name="train", user="alice", cwd="/w"))
    assert Steps._path("out-%J-%s-%t-%n.log", "/w", job, 3) == "/w/out-42.3-3-%t-%n.log"
    assert Steps._path("/abs/%x.%j.%J", "/w", job, 0) == "/abs/train.42.42.0"
    assert Steps._path(None, "/w", job, 1) == ""
