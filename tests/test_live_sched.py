"""The scheduler on live daemons: backfill around a whole-node reservation, and preemption."""

from __future__ import annotations

import dataclasses
import os

import pytest

from gq.errors import ProtocolError, UsageError
from gq.model import JobSpec
from tests.conftest import LiveCluster, wait_for


def test_whole_node_job_gets_its_node_while_short_jobs_fill_gaps(cluster: LiveCluster) -> None:
    # Nine 1-GPU jobs: best fit packs eight onto node1 and one onto node2, so no node is whole.
    # node2's ends first (by its limit), so the big job's reservation is node2.
    blockers = [cluster.submit("-t", "30m" if i < 8 else "10m", "-J", f"blocker{i}",
                               "--wrap", "sleep 600") for i in range(9)]
    placed = {b: cluster.wait_state(b, "RUNNING")["node_list"][0] for b in blockers}
    lone = [b for b, n in placed.items() if n == "node2"]
    assert len(lone) == 1, placed
    big = cluster.submit("-g", "8", "-t", "10m", "-J", "big", "--wrap", "sleep 600")
    wait_for(lambda: cluster.show(big)["reason"] == "Resources", "the big job to wait")
    shown = cluster.show(big)
    assert shown["state"] == "PENDING" and shown["expected_nodes"] == ["node2"]
    assert shown["expected_start"] > cluster.show(lone[0])["start_time"]
    # A short 1-GPU job ends (by its limit) before the big job's reservation: it runs now.
    short = cluster.submit("-t", "1m", "-J", "short", "--wrap", "sleep 1")
    assert cluster.wait_state(short, "RUNNING", "COMPLETED")["node_list"] == ["node2"]
    # A long one would delay the reservation: it waits behind the big job.
    long_ = cluster.submit("-t", "20m", "-J", "long", "--wrap", "sleep 600")
    wait_for(lambda: cluster.show(long_)["reason"] in ("Priority", "Resources"),
             "the long job to wait")
    cluster.wait_state(short, "COMPLETED")
    assert cluster.show(long_)["state"] == "PENDING"
    # The lone blocker on node2 ends: the big job gets node2 at once, not the long job.
    cluster.gq("cancel", str(lone[0]), check=True)
    job = cluster.wait_state(big, "RUNNING", timeout=30)
    assert job["gpu_ids"] == {"node2": list(range(8))}
    assert cluster.show(long_)["state"] == "PENDING"
    cluster.gq("cancel", str(big), str(long_), *(str(b) for b in blockers[:8]), check=True)


def test_pro_job_preempts_free_job_which_checkpoints_and_resumes(cluster: LiveCluster) -> None:
    cluster.reconfigure("[scheduler]\npreempt_exempt_s = 0")
    work = cluster.work
    # The free job: on start, say which run it is and whether its checkpoint exists; on SIGTERM,
    # write the checkpoint and exit; otherwise work "forever" on the first run.
    free_script = work / "free.sh"
    free_script.write_text(f"""#!/bin/bash
ckpt="$GQ_CHECKPOINT_DIR/state"
if [ -f "$ckpt" ]; then found=yes; else found=no; fi
echo "run=$GQ_RESTART_COUNT found=$found ckdir=$GQ_CHECKPOINT_DIR" >> {work}/free.log
[ "$GQ_RESTART_COUNT" -ge 1 ] && exit 0
trap 'echo saved > "$ckpt"; exit 0' TERM
while true; do sleep 0.2; done
""")
    free_jobs = [int(cluster.gq("submit", "--parsable", "-q", "free", "-g", "8", "-t", "1h",
                                str(free_script), check=True).stdout) for _ in range(2)]
    for job_id in free_jobs:
        cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: (work / "free.log").exists()
             and (work / "free.log").read_text().count("run=0") == 2, "both free jobs to start")
    pro = cluster.submit("-q", "pro", "-g", "8", "-t", "10m", "--wrap", "sleep 2; echo pro done")
    cluster.wait_state(pro, "RUNNING", "COMPLETED", timeout=60)
    victims = [j for j in free_jobs if cluster.show(j)["restart_count"] == 1]
    assert len(victims) == 1, "exactly one free job should make room"
    victim = victims[0]
    # The victim is requeued, restarts as run 1 once the pro job is done, and finds its file.
    cluster.wait_state(pro, "COMPLETED")
    final = cluster.wait_state(victim, "COMPLETED", timeout=60)
    assert final["restart_count"] == 1
    lines = (work / "free.log").read_text().splitlines()
    resumed = [line for line in lines if line.startswith("run=1")]
    assert len(resumed) == 1 and "found=yes" in resumed[0], lines
    assert resumed[0].split("ckdir=")[1].endswith(f"/{victim}"), "checkpoint dir is per job"
    other = next(j for j in free_jobs if j != victim)
    assert cluster.show(other)["state"] == "RUNNING" and cluster.show(other)["restart_count"] == 0
    cluster.gq("cancel", str(other), check=True)


def test_job_no_node_could_ever_run_is_refused_at_submit(cluster: LiveCluster) -> None:
    typed = cluster.gq("submit", "--gpu-type", "h100", "--wrap", "true")
    assert typed.returncode == 1 and "no node can ever run this job" in typed.stderr
    assert "8xfake" in typed.stderr
    too_big = cluster.gq("submit", "-g", "9", "--wrap", "true")
    assert too_big.returncode == 1 and "9 GPU(s)" in too_big.stderr
    too_wide = cluster.gq("submit", "-N", "3", "-g", "8", "--wrap", "true")
    assert too_wide.returncode == 1
    vram = cluster.gq("submit", "--gpu-mem", "100G", "--wrap", "true")
    assert vram.returncode == 1 and "100G" in vram.stderr
    with cluster.client() as c:
        assert not c.queue(all=True)
    gang = cluster.submit("-N", "2", "-g", "8", "--wrap", "echo $GQ_NODE_RANK of $WORLD_SIZE")
    assert cluster.wait_state(gang, "COMPLETED")["node_list"] == ["node1", "node2"]


def test_show_explains_a_pending_job(cluster: LiveCluster) -> None:
    blockers = [cluster.submit("-g", "8", "-t", "1h", "--wrap", "sleep 300") for _ in range(2)]
    for b in blockers:
        cluster.wait_state(b, "RUNNING")
    waiting = cluster.submit("-g", "8", "-t", "1h", "--wrap", "true")
    wait_for(lambda: cluster.show(waiting)["reason"] == "Resources", "the job to wait")
    shown = cluster.show(waiting)
    assert set(shown["priority_factors"]) == {"qos", "age", "fairshare", "ratio", "nice"}
    assert shown["priority_factors"]["qos"] == 10_000
    assert shown["expected_start"] and shown["expected_nodes"]
    text = cluster.gq("show", str(waiting), check=True).stdout
    assert "ExpectedStart=" in text and "PriorityFactors=qos:10000" in text
    cluster.gq("cancel", str(waiting), *(str(b) for b in blockers), check=True)


#: The built-in QOS with a grace time for the free tier (a [qos.*] table replaces all three).
_FREE_GRACE_S = 45


def _qos_config(pro: str, free: str | None = None) -> str:
    """Config with no preemption exemption and the normal and pro QOS (and free, when given),
    each with its priority and the extra lines given."""
    text = f"""[scheduler]
preempt_exempt_s = 0

[qos.normal]
priority = 10

[qos.pro]
priority = 100
{pro}
"""
    return text if free is None else text + f"\n[qos.free]\npriority = 1\n{free}\n"


_QOS_WITH_FREE_GRACE = _qos_config(pro='preempts = ["free"]', free=f"grace_s = {_FREE_GRACE_S}")


def test_preempted_job_gets_its_signal_and_its_qos_grace(cluster: LiveCluster) -> None:
    cluster.reconfigure(_QOS_WITH_FREE_GRACE)
    work = cluster.work
    # It checkpoints on USR1 and ignores SIGTERM: had it got SIGTERM, it would have saved nothing
    # and been killed only after the grace. The one not preempted ends when the test says so.
    script = work / "free.sh"
    script.write_text(f"""#!/bin/bash
ckpt="$GQ_CHECKPOINT_DIR/state"
echo "run=$GQ_RESTART_COUNT found=$(cat "$ckpt" 2>/dev/null || echo none)" >> {work}/free.log
[ "$GQ_RESTART_COUNT" -ge 1 ] && exit 0
trap '' TERM
trap 'echo saved-on-USR1 > "$ckpt"; exit 0' USR1
while [ ! -e {work}/stop ]; do sleep 0.2; done
""")
    free = [cluster.submit("-q", "free", "-g", "8", "-t", "1h", "--signal", "usr1", str(script))
            for _ in range(2)]
    for job_id in free:
        cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: (work / "free.log").exists()
             and (work / "free.log").read_text().count("run=0") == 2, "both free jobs to start")
    assert cluster.show(free[0])["signal"] == "USR1@60"
    assert "Signal=USR1@60" in cluster.gq("show", str(free[0]), check=True).stdout
    pro = cluster.submit("-q", "pro", "-g", "8", "-t", "10m", "--wrap", "sleep 1")
    cluster.wait_state(pro, "COMPLETED")
    victims = [j for j in free if cluster.show(j)["restart_count"] == 1]
    assert len(victims) == 1, "exactly one free job should make room"
    victim = victims[0]
    assert cluster.wait_state(victim, "COMPLETED")["restart_count"] == 1
    resumed = [line for line in (work / "free.log").read_text().splitlines()
               if line.startswith("run=1")]
    assert resumed == ["run=1 found=saved-on-USR1"]
    assert f"preempting job {victim} for job {pro} (SIGUSR1, grace {_FREE_GRACE_S}s)" \
        in cluster.log("gqd")
    (work / "stop").touch()
    cluster.wait_state(next(j for j in free if j != victim), "COMPLETED")


def test_signal_comes_its_lead_time_before_the_limit(cluster: LiveCluster) -> None:
    work = cluster.work
    script = work / "warned.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --signal=B:USR1@4
trap 'echo "warned $(date +%s)" >> {work}/warned.log' USR1
echo "start $(date +%s)" >> {work}/warned.log
while true; do sleep 0.2; done
""")
    job_id = cluster.submit("-t", "8s", str(script))
    final = cluster.wait_state(job_id, "TIMEOUT")
    assert final["signal"] == "B:USR1@4"
    lines = [line.split() for line in (work / "warned.log").read_text().splitlines()]
    assert [word for word, _ in lines] == ["start", "warned"], lines  # once, before the limit
    assert 2 <= int(lines[1][1]) - int(lines[0][1]) <= 6, lines
    # The head checks what a raw client sends, too.
    spec = JobSpec(script="#!/bin/sh\ntrue\n", uid=os.getuid(), gid=os.getgid(), cwd=str(work))
    with cluster.client() as c:
        with pytest.raises(UsageError, match="bad --signal 'SIGSTOP'"):
            c.submit([dataclasses.replace(spec, signal="SIGSTOP")])
        with pytest.raises(ProtocolError, match="'signal'"):
            c.submit([dataclasses.replace(spec, signal=10)])  # type: ignore[arg-type]


def test_sharing_jobs_run_together_on_one_gpu_while_their_vram_fits(cluster: LiveCluster) -> None:
    # Fake GPUs have 80 GiB: two 30G sharers fit on one GPU, a third does not.
    work = cluster.work
    go = work / "share.go"
    script = work / "share.sh"
    script.write_text(f"""#!/bin/bash
echo "$(hostname) $GQ_NODELIST $CUDA_VISIBLE_DEVICES" > {work}/share.$GQ_JOB_ID
while [ ! -f {go} ]; do sleep 0.1; done
""")
    sharers = [cluster.submit("--share", "--gpu-mem", "30G", "-t", "5m", str(script))
               for _ in range(3)]
    placed = {j: cluster.wait_state(j, "RUNNING")["gpu_ids"] for j in sharers}
    for j in sharers:  # the job itself saw the GPU it was given
        wait_for(lambda: (work / f"share.{j}").exists(), f"sharer {j} to start")
        node, gpus = next(iter(placed[j].items()))
        seen = (work / f"share.{j}").read_text().split()
        assert seen[1:] == [node, ",".join(map(str, gpus))], seen
    first, second, third = (placed[j] for j in sharers)
    assert first == second, "two 30G sharers share one 80G GPU"
    assert third != first, "a third would need 90G of 80G"
    # An exclusive job never lands on a GPU that sharers hold.
    exclusive = cluster.submit("-t", "5m", "--wrap", "sleep 600")
    alloc = cluster.wait_state(exclusive, "RUNNING")["gpu_ids"]
    held = {(n, g) for a in placed.values() for n, gpus in a.items() for g in gpus}
    assert not {(n, g) for n, gpus in alloc.items() for g in gpus} & held
    assert cluster.show(sharers[0])["share"] is True
    go.write_text("")
    for j in sharers:
        cluster.wait_state(j, "COMPLETED")
    cluster.gq("cancel", str(exclusive), check=True)
    # --share without the VRAM it needs is a usage error, before anything is sent.
    bad = cluster.gq("submit", "--share", "--wrap", "true")
    assert bad.returncode == 2 and "--gpu-mem" in bad.stderr


def test_pool_owner_takes_back_a_borrowed_node(cluster: LiveCluster) -> None:
    # node2 is pro's pool. normal work fills node1 first, then borrows node2; a pro job
    # takes node2 back by preempting the borrower (pro preempts no normal job elsewhere).
    cluster.reconfigure(_qos_config(pro='pool = ["node2"]'))
    fillers = [cluster.submit("-t", "30m", "--wrap", "sleep 600") for _ in range(8)]
    assert {cluster.wait_state(j, "RUNNING")["node_list"][0] for j in fillers} == {"node1"}
    borrower = cluster.submit("-g", "8", "-t", "30m", "--wrap", "sleep 600")
    assert cluster.wait_state(borrower, "RUNNING")["node_list"] == ["node2"]
    pro = cluster.submit("-q", "pro", "-g", "8", "-t", "5m", "--wrap", "sleep 600")
    assert cluster.wait_state(pro, "RUNNING", timeout=60)["node_list"] == ["node2"]
    back = cluster.show(borrower)
    assert back["state"] == "PENDING" and back["restart_count"] == 1
    # It may not borrow node2 again while the owner holds it; node1's jobs were never touched.
    assert all(cluster.show(j)["state"] == "RUNNING" and cluster.show(j)["restart_count"] == 0
               for j in fillers)
    cluster.gq("cancel", str(pro), str(borrower), *(str(j) for j in fillers), check=True)
