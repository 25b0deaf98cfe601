"""Power saving's parts (issue 20): the pure choice of nodes to resume (gq/sched/resume.py), the
[power] table's checks, the head's power states over a chosen clock (rate, timeout, restart,
suspend), the pending-demand metric and Slurm's state words."""

from __future__ import annotations

from pathlib import Path

import pytest

from gq import config as config_mod
from gq import protocol
from gq.errors import ConfigError
from gq.head.auth import Caller
from gq.head.core import Head
from gq.head.metrics import pending_demand, vram_class
from gq.messages import read as read_message
from gq.model import JobSpec, NodeState, parse_gpu_spec
from gq.powercfg import shapes
from gq.sched.resume import Room, to_resume
from gq.sched.types import PendingJob
from gq.slurm.scontrol import node_state
from gq.store import Store
from tests.test_head_pass import OWNER

T0 = 1_000_000.0
ADMIN = Caller(uid=0, user="root", proven=True, admin=True)
G = 1 << 30


def _room(name: str, spec: str, cpus: int = 0, mem: int = 0) -> Room:
    return Room.of(name, parse_gpu_spec(spec), cpus, mem)


def _job(i: int, gpus: int = 1, gpu_type: str | None = None, gpu_mem: int | None = None,
         nodes: int = 1, **kw: object) -> PendingJob:
    return PendingJob(id=i, qos="normal", submit_time=float(i), gpus=gpus, gpu_type=gpu_type,
                      gpu_mem=gpu_mem, nodes=nodes, **kw)  # type: ignore[arg-type]


def _down() -> list[Room]:
    return [_room("small1", "2xl4:24G"), _room("small2", "2xl4:24G"),
            _room("big1", "4xa100:80G"), _room("big2", "4xa100:80G")]


def test_just_enough_nodes_of_the_fitting_shape_are_chosen() -> None:
    jobs = [_job(1, 2, "a100"), _job(2, 2, "a100"), _job(3, 1, "l4", 20 * G)]
    assert to_resume(jobs, [], _down()) == ["big1", "small1"]  # the two A100 jobs share big1
    assert to_resume([_job(1, 3, "a100"), _job(2, 3, "a100")], [], _down()) == ["big1", "big2"]
    # By VRAM alone: 40 GB fits no L4; a job of no type takes the smallest node that fits.
    assert to_resume([_job(1, 1, None, 40 * G)], [], _down()) == ["big1"]
    assert to_resume([_job(1, 1)], [], _down()) == ["small1"]
    # What no declared node could hold resumes nothing.
    assert to_resume([_job(1, 8, "a100"), _job(2, 1, "h100")], [], _down()) == []


def test_room_coming_or_free_counts_first_and_the_limit_holds() -> None:
    coming = [_room("big1", "4xa100:80G")]
    assert to_resume([_job(1, 2, "a100"), _job(2, 2, "a100")], coming, _down()[3:]) == []
    assert to_resume([_job(i, 2, "a100") for i in range(3)], coming, _down()[3:]) == ["big2"]
    assert to_resume([_job(i, 4, "a100") for i in range(3)], [], _down(), limit=1) == ["big1"]
    # A two-node job needs two nodes at once; within a limit of one it takes none, and a
    # later one-node job still gets its node.
    assert to_resume([_job(1, 4, "a100", nodes=2), _job(2, 1, "l4")], [], _down(),
                     limit=1) == ["small1"]
    assert to_resume([_job(1, 4, "a100", nodes=2)], [], _down()) == ["big1", "big2"]


def test_partition_cpus_and_memory_are_part_of_the_fit() -> None:
    down = [_room("a1", "4xa100:80G", cpus=8, mem=64 * G), _room("a2", "4xa100:80G")]
    assert to_resume([_job(1, 1, "a100", allowed=frozenset({"a2"}))], [], down) == ["a2"]
    assert to_resume([_job(1, 1, "a100", cpus=16)], [], down) == ["a2"]  # a2 names no CPUs
    assert to_resume([_job(1, 1, "a100", mem=32 * G)], [], down) == ["a1"]


def test_the_power_table_is_checked_at_start_naming_the_key() -> None:
    cfg = config_mod.from_dict({"power": {"resume_program": "/bin/true", "nodes": [
        "cloud[1-2]:cpus=32,mem=256G,gpus=4xa100:80G,features=ib+fast"]}}, "gq.toml")
    nodes = shapes(cfg.power)
    assert [n.name for n in nodes] == ["cloud1", "cloud2"]
    assert (nodes[0].cpus, nodes[0].mem, nodes[0].features) == (32, 256 * G, ["ib", "fast"])
    assert [g.type for g in nodes[1].gpus] == ["a100"] * 4
    assert all(n.state == NodeState.POWERED_DOWN for n in nodes)
    for table, words in [
            ({"nodes": ["c1:gpus=4xa100"]}, "no resume_program"),
            ({"resume_program": "x", "nodes": ["c1:gpus=4xq!"]}, "[power] nodes: 'c1:gpus=4xq!'"),
            ({"resume_program": "x", "nodes": ["c1:disk=9"]}, "expected cpus="),
            ({"resume_program": "x", "nodes": ["c[1-2]", "c2"]}, "'c2' is declared twice"),
            ({"suspend_time": 0}, "[power] suspend_time must be"),
            ({"resume_rate": -1}, "[power] resume_rate must be"),
            ({"resume_timeout": "1m"}, "[power] resume_timeout must be a float")]:
        with pytest.raises(ConfigError, match=r"^gq\.toml: ") as exc:
            config_mod.from_dict({"power": table}, "gq.toml")
        assert words in str(exc.value)


def _cloud_head(store: Store, **power: object) -> Head:
    table = {"resume_program": "/bin/true", "suspend_program": "/bin/true", "suspend_time": 5,
             "resume_timeout": 30, "nodes": ["c[1-3]:gpus=1xa100:80G"], **power}
    return Head(config_mod.from_dict({"power": table}), store, T0, steady=lambda now: now)


def _submit(head: Head, now: float, **kw: object) -> int:
    spec = JobSpec(script="#!/bin/sh\ntrue\n", cwd="/tmp", time_limit_s=60, **kw)  # type: ignore[arg-type]
    with head.tx():
        reply = head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [spec.to_dict()]},
                                   OWNER, None, now)
    return reply["ids"][0]


def _turn(head: Head, now: float) -> None:
    with head.tx():
        head.tick(now)
    with head.tx():
        head.schedule(now)
    head.power.send()
    for proc, _ in head.power.running:  # (/bin/true: done at once; reaped by the next turn)
        proc.wait(timeout=10)


def _states(head: Head) -> dict[str, str]:
    return {n.name: n.state.value for n in head.nodes.values()}


def test_resume_rate_timeout_and_a_restart(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "gq.db"))
    head = _cloud_head(store, resume_rate=1)
    assert _states(head) == dict.fromkeys(("c1", "c2", "c3"), "POWERED_DOWN")
    ids = [_submit(head, T0, gpus=1, gpu_type="a100") for _ in range(3)]
    for now in (T0, T0 + 1, T0 + 2):
        _turn(head, now)
    assert _states(head) == {"c1": "POWERING_UP", "c2": "POWERED_DOWN", "c3": "POWERED_DOWN"}
    # The job laid on c1 says so, past the passes since (the rate holds back the others').
    assert [head.jobs[i].reason for i in ids] == ["PoweringUp (c1)", "Priority", "Priority"]
    _turn(head, T0 + 32)  # c1 (resumed at T0 + 1) timed out; the rate (one a minute) holds c2
    assert head.nodes["c1"].state == NodeState.DOWN
    assert head.jobs[ids[0]].reason == "Resources"  # no node comes for it now
    assert head.nodes["c1"].reason == "resume timed out after 30s"
    assert head.nodes["c2"].state == NodeState.POWERED_DOWN
    _turn(head, T0 + 61)
    assert _states(head) == {"c1": "DOWN", "c2": "POWERING_UP", "c3": "POWERED_DOWN"}
    # gqd restarts: the power states come back from the store; c2's resume clock starts anew.
    again = _cloud_head(store, resume_rate=1)
    assert _states(again) == {"c1": "DOWN", "c2": "POWERING_UP", "c3": "POWERED_DOWN"}
    # An admin's drain keeps c3 off, and it is never resumed.
    with again.tx():
        again.handle_client({"type": protocol.DRAIN, "rid": 1, "nodes": ["c3"],
                             "reason": "bad image"}, ADMIN, None, T0 + 99)
    _turn(again, T0 + 100)
    assert again.nodes["c2"].state == NodeState.POWERING_UP
    _turn(again, T0 + 131)
    assert again.nodes["c2"].state == NodeState.DOWN
    # `gq admin resume` of the DOWN c1 makes it POWERED_DOWN again, and it is resumed for the
    # jobs still waiting.
    with again.tx():
        again.handle_client({"type": protocol.RESUME, "rid": 1, "nodes": ["c1"]}, ADMIN, None,
                            T0 + 140)
    assert _states(again) == {"c1": "POWERED_DOWN", "c2": "DOWN", "c3": "POWERED_DOWN"}
    assert again.nodes["c3"].drain_reason == "bad image"
    _turn(again, T0 + 141)
    _turn(again, T0 + 142)
    assert _states(again) == {"c1": "POWERING_UP", "c2": "DOWN", "c3": "POWERED_DOWN"}


def _register(head: Head, name: str, now: float) -> None:
    with head.tx():
        head.handle_node(name, read_message({
            "type": protocol.REGISTER, "node": name, "cpus": 8, "mem": 1 << 34, "running": [],
            "gpus": [{"index": 0, "type": "a100", "memory": 80 * G}]}), now)


def test_a_resumed_node_registers_runs_and_is_suspended_when_idle(tmp_path: Path) -> None:
    head = _cloud_head(Store(str(tmp_path / "gq.db")))
    job = _submit(head, T0, gpus=1, gpu_type="a100")
    _turn(head, T0)
    _turn(head, T0 + 0.5)
    assert head.nodes["c1"].state == NodeState.POWERING_UP
    _register(head, "c1", T0 + 1)
    _turn(head, T0 + 1)
    assert head.nodes["c1"].state == NodeState.UP and head.jobs[job].alloc == {"c1": [0]}
    assert [n for n, s in _states(head).items() if s != "POWERED_DOWN"] == ["c1"]  # no more
    with head.tx():
        head.table.cancel(head.jobs[job], T0 + 2)
        head.table.release(head.jobs[job])
    for now in (T0 + 3, T0 + 8.5):
        _turn(head, now)
    assert head.nodes["c1"].state == NodeState.POWERING_DOWN
    assert head.nodes["c1"].reason == "suspended after 5s idle"
    # Its last heartbeat, as the suspend program stops it, does not bring it back.
    head.take_orders()
    with head.tx():
        head.handle_node("c1", read_message({"type": protocol.HEARTBEAT, "node": "c1"}), T0 + 9)
    assert not head.take_orders()
    _turn(head, T0 + 10)
    assert head.nodes["c1"].state == NodeState.POWERED_DOWN


def test_an_idle_node_a_pending_job_fits_is_not_suspended(tmp_path: Path) -> None:
    head = _cloud_head(Store(str(tmp_path / "gq.db")))
    with head.tx():  # c1 is up (an admin booted it, say); c2 and c3 are off
        head.nodes["c1"].state = NodeState.POWERING_UP
    _register(head, "c1", T0)
    # A two-node job: c1 and one more node; c2 is resumed and never comes.
    gang = _submit(head, T0, nodes=2, gpus=1, gpu_type="a100")
    for now in (T0, T0 + 1, T0 + 2, T0 + 9):
        _turn(head, now)
    assert head.jobs[gang].state.value == "PENDING"
    assert _states(head) == {"c1": "UP", "c2": "POWERING_UP", "c3": "POWERED_DOWN"}
    with head.tx():
        head.table.cancel(head.jobs[gang], T0 + 10)
    for now in (T0 + 10, T0 + 16):  # nothing wants it now: idle past suspend_time, suspended
        _turn(head, now)
    assert head.nodes["c1"].state == NodeState.POWERING_DOWN


def test_pending_demand_by_gpu_type_and_vram_class() -> None:
    class Job:  # the state is all pending_demand reads of a job
        def __init__(self, state: str) -> None:
            from gq.model import JobState
            self.state = JobState(state)
    views = [_job(1, 4, "A100", 80 * G), _job(2, 2, "a100", 80 * G - 1), _job(3, 1),
             _job(4, 8, "h100"), _job(5, 0)]
    jobs = {1: Job("PENDING"), 2: Job("PENDING"), 3: Job("PENDING"), 4: Job("RUNNING"),
            5: Job("PENDING")}
    assert pending_demand(views, jobs) == {("a100", "80G"): 6, ("any", "any"): 1}  # type: ignore[arg-type]
    assert vram_class(None) == "any" and vram_class(24 * G + 1) == "25G"


def test_slurm_state_words_of_power_states() -> None:
    from gq.slurm.scontrol import _long_state
    from gq.slurm.sinfo import COMPACT
    node = {"gpus": [], "cpus": 8}
    words = [node_state({**node, "state": s}, 0)
             for s in ("POWERED_DOWN", "POWERING_UP", "POWERING_DOWN")]
    assert words == ["idle~", "idle#", "idle%"]
    assert all(COMPACT[w] == w for w in words)  # sinfo's %t of each
    assert _long_state({**node, "state": "POWERED_DOWN"}, 0) == "IDLE+CLOUD+POWERED_DOWN"
    assert _long_state({**node, "state": "UP"}, 0) == "IDLE"
