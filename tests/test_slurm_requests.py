"""Slurm's requests as gq holds them (gq/tasks.py), and gqd's admission of them: partitions,
the default GPUs, requests no node can hold, node sets the scheduler keeps to, and
`--test-only`'s estimate. A `Head` on an in-memory store, driven by its handlers; the expected
figures of the corpus-style cases are what the real Slurm 22.05 peer gave those requests
(SLURM_CPUS_ON_NODE, SLURM_GPUS_ON_NODE, SLURM_MEM_PER_NODE: ../shared/peers/slurm)."""

from __future__ import annotations

from typing import Any

import pytest

from gq import protocol
from gq.cli import fast, submission
from gq.config import Config, PartitionConfig, from_dict
from gq.errors import PermissionDenied, RefusedError
from gq.head.auth import Caller
from gq.head.core import Head
from gq.messages import read as read_message
from gq.store import Store
from gq.tasks import Capacity, resolve

OWNER = Caller(uid=1000, user="ann", proven=True)
ADMIN = Caller(uid=1001, user="root", proven=True, admin=True)
T0 = 1_000_000.0
G = 1 << 30
#: The peer's corpus nodes: 8 GPUs, 192 CPUs, ~2.4 TB each.
BIG = Capacity(gpus=8, cpus=192, mem=2_500_000 << 20)


def _request(words: list[str], script: str = "#!/bin/sh\ntrue\n") -> dict[str, Any]:
    """The spec `gq submit WORDS` sends for `script`."""
    parsed = fast.parse(fast.SUBMIT_OPTIONS, [*words, "--wrap", "x"] if words is not None
                        else [], interspersed=False)
    assert parsed is not None

    def words_of(ws: list[str]) -> tuple[dict[str, Any], set[str]]:
        got = fast.parse(fast.SUBMIT_OPTIONS, ws, interspersed=False)
        assert got is not None
        return got[0], got[1]
    fields, _, slurm = submission.gather(script, parsed[0], parsed[1], words_of)
    return submission.build_spec(script, "x", [], fields, slurm=slurm)


def _resolved(words: list[str], nodes: list[Capacity] = [BIG], default_gpus: int = 1,  # noqa: B006
              ) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    return resolve(_request(words), nodes, default_gpus, warnings), warnings


# ---------------------------------------------------------------- the mapping


@pytest.mark.parametrize("words,held", [
    # (nodes, GPUs, CPUs and memory per node, tasks), as Slurm allocated them for the corpus's
    # scripts (02, 03, 07, 12, 13, 20, 23, 24).
    (["-N", "2", "--ntasks-per-node", "2", "-c", "8", "--mem", "32G", "--gres", "gpu:2"],
     (2, 2, 16, 32 * G, 4)),
    (["-N", "4", "-n", "4", "--gpus-per-task", "1", "-c", "4"], (4, 1, 4, 0, 4)),
    (["-c", "5", "--mem-per-cpu", "1G", "-N", "4", "--tasks-per-node", "1"],
     (4, 0, 5, 5 * G, 4)),
    (["-n", "1", "--ntasks-per-node", "1", "-c", "4", "--gpus-per-task", "l40s:1",
      "--mem-per-gpu", "16G"], (1, 1, 4, 16 * G, 1)),
    (["--gpus-per-task", "rtx8000:1", "-c", "4", "--ntasks-per-node", "4", "--mem", "16G"],
     (1, 4, 16, 16 * G, 4)),
    (["-N", "2", "--ntasks-per-node", "4", "-c", "10", "--gres", "gpu:a100:4"],
     (2, 4, 40, 0, 8)),
    (["-N", "2", "--gpus-per-node", "4", "--ntasks-per-node", "4", "-c", "6", "--mem", "90G"],
     (2, 4, 24, 90 * G, 8)),
    (["--gpus", "1", "--cpus-per-gpu", "36"], (1, 1, 36, 0, None)),
    # Without -N, as many nodes as the tasks need: 8 one-GPU tasks fit one 8-GPU node, 16 two.
    (["-n", "8", "--gpus-per-task", "1"], (1, 8, 0, 0, 8)),
    (["-n", "16", "--gpus-per-task", "1"], (2, 8, 0, 0, 16)),
    (["--gpus", "16"], (2, 8, 0, 0, None)),
    # Uneven tasks: every node holds as many as the fullest (Slurm lays out 2 then 1).
    (["-n", "3", "-c", "2", "-N", "2"], (2, 0, 4, 0, 3)),
    # --exclusive: the whole node.
    (["--exclusive", "-N", "1"], (1, 8, 192, 2_500_000 << 20, None)),
])
def test_slurm_requests_become_gangs_of_like_nodes(words: list[str], held: tuple[Any, ...]
                                                   ) -> None:
    spec, _ = _resolved(words, default_gpus=0)
    assert (spec["nodes"], spec["gpus"], spec["cpus"], spec["mem"], spec["ntasks"]) == held


def test_what_gq_does_otherwise_than_asked_is_a_warning() -> None:
    spec, warnings = _resolved(["--gpus", "3", "-N", "2"])
    assert spec["gpus"] == 2
    assert warnings == ["--gpus 3 over 2 nodes: gq gives each node the same, 2 GPUs (4 in all)"]
    spec, warnings = _resolved(["-N", "2", "-n", "1"])
    assert spec["nodes"] == 1 and "setting the node count to 1" in warnings[0]


def test_requests_that_contradict_themselves_are_refused() -> None:
    with pytest.raises(RefusedError, match="-n 16 tasks do not fit on 2 node"):
        _resolved(["-n", "16", "-N", "2", "--ntasks-per-node", "4"])
    with pytest.raises(RefusedError, match="no node can hold even one task"):
        _resolved(["-n", "2", "--gpus-per-task", "9"])
    with pytest.raises(RefusedError, match="gq gives a job at most 64"):
        _resolved(["-n", "1000", "--gpus-per-task", "1"])


def test_the_default_gpus_go_to_a_gq_job_that_asks_for_none_and_not_to_a_slurm_script() -> None:
    assert _request([])["gpus"] is None  # gqd's default
    assert _resolved([], default_gpus=2)[0]["gpus"] == 2
    slurm = _request([], "#!/bin/sh\n#SBATCH -J x\ntrue\n")
    assert slurm["gpus"] == 0 and slurm["output"] == "slurm-%j.out"
    assert _request([], "#!/bin/sh\n#SBATCH -a 1-3\ntrue\n")["output"] == "slurm-%A_%a.out"
    # A GPU asked for in any form is not the default's.
    assert _request([], "#!/bin/sh\n#SBATCH --gpus-per-task=1 -n 2\ntrue\n")["gpus"] is None
    assert _resolved(["--gpus-per-task", "1", "-n", "2"], default_gpus=5)[0]["gpus"] == 2


# ---------------------------------------------------------------- gqd's admission


def _register(head: Head, name: str, gpus: int = 8, gpu_type: str = "a100", cpus: int = 32,
              mem: int = 256 * G, features: list[str] | None = None) -> None:
    with head.store.tx():
        head.handle_node(name, read_message({"type": protocol.REGISTER, "node": name, "cpus": cpus,
                                "mem": mem, "running": [], "features": features or [],
                                "gpus": [{"index": i, "type": gpu_type, "memory": 80 * G}
                                         for i in range(gpus)]}), T0)


def _head(cfg: Config | None = None, nodes: int = 2) -> Head:
    head = Head(cfg or Config(path=""), Store(":memory:"), T0)
    for i in range(nodes):
        _register(head, f"n{i + 1}", features=["gpu", "gpu80"] if i == 0 else ["gpu"])
    return head


def _submit(head: Head, words: list[str], caller: Caller = OWNER,
            script: str = "#!/bin/sh\ntrue\n") -> dict[str, Any]:
    raw = _request(words, script)
    with head.store.tx():
        return head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [raw]}, caller,
                                  None, T0)


def _job(head: Head, reply: dict[str, Any]) -> Any:
    return head.jobs[reply["ids"][0]]


def _partitioned() -> Config:
    return from_dict({
        "qos": {"normal": {}, "high": {"priority": 50}},
        "partition": {"gpu": {"nodes": ["n[1-2]"], "default": True},
                      "short": {"nodes": ["n2"], "default_qos": "high", "default_time": "30",
                                "max_time": "1:00:00"}}})


def test_gq_submit_gets_the_configured_default_gpus() -> None:
    head = _head(from_dict({"scheduler": {"default_gpus": 3}}))
    assert _job(head, _submit(head, [])).spec.gpus == 3
    assert _job(head, _submit(head, [], script="#!/bin/sh\n#SBATCH -t 5\ntrue\n")).spec.gpus == 0


def test_a_partition_is_chosen_defaulted_and_checked() -> None:
    head = _head(_partitioned())
    job = _job(head, _submit(head, []))
    assert job.spec.partition == "gpu"
    short = _job(head, _submit(head, ["-p", "short"])).spec
    assert (short.partition, short.qos, short.time_limit_s) == ("short", "high", 1800)
    with pytest.raises(RefusedError, match="invalid partition 'train'; known: gpu, short"):
        _submit(head, ["-p", "train"])
    with pytest.raises(RefusedError, match="over the partition's maximum of 01:00:00"):
        _submit(head, ["-p", "short", "-t", "2:00:00"])
    with pytest.raises(RefusedError, match="unknown QOS 'turing'; known: high, normal"):
        _submit(head, ["-q", "turing"])


def test_without_partitions_any_name_runs_everywhere_with_a_warning() -> None:
    head = _head()
    reply = _submit(head, ["-p", "train"])
    assert _job(head, reply).spec.partition == "train"
    assert reply["warnings"] == ["no partitions are configured here: partition 'train' is "
                                 "every node"]
    assert "warnings" not in _submit(head, ["-p", "gpu"])  # the one there is


@pytest.mark.parametrize("words,said", [
    (["-c", "64"], "it asks for 1 GPU(s), 64 CPUs on each of 1 node(s); 0 node(s) could "
                   "(nodes have: 8xa100 32 CPUs 256G)"),
    (["--mem", "100T"], "100T of memory"),
    (["-g", "9"], "it asks for 9 GPU(s)"),
    (["-g", "h100:1"], "of type h100"),
    (["--gpu-mem", "90G"], "with at least 90G each"),
    (["-C", "nvlink"], "none of the 2 node(s) is in its partition gpu, constraint nvlink"),
    (["-w", "n9"], "none of the 2 node(s) is in its partition gpu, node list n9"),
    (["-N", "2", "-C", "gpu80"], "1 node(s) of the 1 in its partition gpu, constraint gpu80"),
])
def test_a_request_no_node_can_hold_is_refused_with_the_reason(words: list[str], said: str
                                                               ) -> None:
    head = _head()
    with pytest.raises(RefusedError, match="no node can ever run this job") as info:
        _submit(head, words)
    assert said in str(info.value)


def test_only_an_admin_may_raise_a_priority_with_nice() -> None:
    head = _head()
    with pytest.raises(PermissionDenied, match="negative --nice"):
        _submit(head, ["--nice=-5"])
    assert _job(head, _submit(head, ["--nice=-5"], ADMIN)).spec.nice == -5
    assert _job(head, _submit(head, ["--nice", "5"])).spec.nice == 5


# ---------------------------------------------------------------- where the scheduler puts jobs


def _pass(head: Head) -> None:
    with head.store.tx():
        head.schedule(T0)


@pytest.mark.parametrize("words,node", [
    (["-p", "short"], "n2"), (["-w", "n2"], "n2"), (["-x", "n1"], "n2"),
    (["-C", "gpu80"], "n1"), (["-C", "gpu80|nvlink"], "n1"), (["-C", "gpu&gpu80"], "n1"),
])
def test_jobs_run_only_on_the_nodes_they_may_use(words: list[str], node: str) -> None:
    head = _head(_partitioned())
    # Best fit would pack them all on one node; each must go where its request allows.
    ids = [_submit(head, [*words, "-g", "1"])["ids"][0] for _ in range(3)]
    _pass(head)
    assert {n for i in ids for n in head.jobs[i].alloc} == {node}


def test_a_node_that_comes_with_a_feature_takes_the_jobs_waiting_for_it() -> None:
    head = _head(nodes=1)
    job = _job(head, _submit(head, ["-C", "gpu"]))
    _register(head, "n2", features=["nvlink"])
    waiting = _job(head, _submit(head, ["-C", "nvlink", "-g", "8"]))
    _pass(head)
    assert list(job.alloc) == ["n1"] and list(waiting.alloc) == ["n2"]


# ---------------------------------------------------------------- --test-only


def _test_only(head: Head, words: list[str]) -> dict[str, Any]:
    return head.handle_client({"type": protocol.TEST_SUBMIT, "rid": 1,
                               "job": _request(words)}, OWNER, None, T0)


def test_test_only_says_when_and_where_and_keeps_nothing() -> None:
    head = _head(_partitioned())
    now = _test_only(head, ["-g", "2", "-c", "4", "-p", "short"])
    assert (now["start"], now["nodes"], now["cpus"], now["partition"]) == \
        ("1970-01-12T13:46:40Z", ["n2"], 4, "short")
    assert not head.jobs and now["id"] == 1
    # Both nodes full for an hour: the estimate is when the first job ends.
    for _ in range(2):
        _submit(head, ["-g", "8", "-t", "60"])
    _pass(head)
    later = _test_only(head, ["-g", "1", "-t", "10"])
    assert later["start"] == "1970-01-12T14:46:40Z" and len(later["nodes"]) == 1
    assert later["id"] == 3 and len(head.jobs) == 2


def test_partition_config_needs_nodes_and_known_qos() -> None:
    from gq.errors import ConfigError
    with pytest.raises(ConfigError, match=r"\[partition.p\] nodes must list node names"):
        from_dict({"partition": {"p": {}}})
    with pytest.raises(ConfigError, match="default_qos 'x' is no"):
        from_dict({"partition": {"p": {"nodes": ["n1"], "default_qos": "x"}}})
    with pytest.raises(ConfigError, match="more than one"):
        from_dict({"partition": {"p": {"nodes": ["n1"], "default": True},
                                 "q": {"nodes": ["n1"], "default": True}}})
    assert from_dict({"partition": {"p": {"nodes": ["n[1-2]"]}}}).partition["p"] == \
        PartitionConfig(nodes=["n[1-2]"])


# ---------------------------------------------------------------- filtered control


def test_a_filtered_cancel_takes_the_live_jobs_that_match_and_only_the_callers() -> None:
    head = _head()
    mine = [_job(head, _submit(head, ["-J", name, "-H"])).id for name in ("a", "a", "b")]
    theirs = _job(head, _submit(head, ["-J", "a", "-H"], Caller(uid=1002, user="bob",
                                                                 proven=True))).id

    def cancel(caller: Caller, flt: dict[str, Any], ids: list[Any] | None = None
               ) -> dict[str, Any]:
        with head.store.tx():
            return head.handle_client({"type": protocol.CANCEL, "rid": 1, "ids": ids or [],
                                       "filter": flt}, caller, None, T0)
    assert cancel(OWNER, {"name": "a", "states": ["PENDING"]})["cancelled"] == mine[:2]
    assert head.jobs[theirs].state.value == "PENDING"  # not the caller's
    assert cancel(OWNER, {"name": "b"}, [mine[0], 999])["cancelled"] == []  # among those ids
    assert cancel(OWNER, {"user": "bob"})["errors"] == {
        str(theirs): f"permission denied: job {theirs} belongs to bob"}
    assert cancel(ADMIN, {"partition": "gpu"})["cancelled"] == [mine[2], theirs]
    from gq.errors import ProtocolError
    with pytest.raises(ProtocolError, match="filter"):
        cancel(OWNER, {"colour": "red"})
