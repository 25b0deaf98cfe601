"""Slurm users' habits on live daemons: mail, partitions and --test-only through the real CLI,
the Slurm commands (sbatch, squeue, scancel, sacct, scontrol, sinfo) and the environment a
batch job gets."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

from tests.conftest import LiveCluster, prepare, running, wait_for


def _recorder(path: Path) -> Path:
    """A mail program that records its arguments, one line a mail."""
    script = path.with_suffix(".sh")
    script.write_text(f"#!/bin/sh\nprintf '%s|' \"$@\" >> {path}\necho >> {path}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_mail_is_sent_by_the_configured_program_on_begin_end_and_failure(tmp_path: Path
                                                                         ) -> None:
    live = prepare(tmp_path)
    log = tmp_path / "mail.log"
    program = _recorder(log)
    live.configure(lambda cfg: setattr(cfg.head, "mail_program", str(program)))
    with running(live, nodes=1):
        ok = live.submit("--mail-type=ALL", "-J", "good", "--wrap", "true")
        bad = live.submit("--mail-type=FAIL", "--mail-user", "ops@example.org", "-J", "bad",
                          "--wrap", "exit 3")
        quiet = live.submit("--mail-type=END", "-J", "quiet", "-H", "--wrap", "true")
        live.wait_state(ok, "COMPLETED")
        live.wait_state(bad, "FAILED")
        live.gq("cancel", str(quiet), check=True)
        lines = wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 4
                         and log.read_text().splitlines(), "four mails")
    mails = sorted(lines)
    assert any(m.startswith(f"-s|Slurm Job_id={ok} Name=good Began, Queued time 00:00:0")
               and m.endswith(f"|{os.environ.get('USER') or 'root'}|") for m in mails), mails
    assert any(f"Slurm Job_id={ok} Name=good Ended, Run time 00:00:0" in m
               and ", COMPLETED, ExitCode 0|" in m for m in mails), mails
    assert any(f"Slurm Job_id={bad} Name=bad Failed, Run time 00:00:0" in m
               and ", FAILED, ExitCode 3|ops@example.org|" in m for m in mails), mails
    assert any(f"Slurm Job_id={quiet} Name=quiet Ended, Run time 00:00:00, CANCELLED" in m
               for m in mails), mails
    assert len(mails) == 4  # no BEGIN for the FAIL-only and END-only jobs


def test_partitions_configured_by_the_site_keep_jobs_on_their_nodes(cluster: LiveCluster
                                                                    ) -> None:
    cluster.reconfigure('[partition.big]\nnodes = ["node1"]\ndefault = true\n'
                        '[partition.small]\nnodes = ["node2"]\nmax_time = "10:00"\n')
    jobs = [cluster.submit("-p", "small", "--wrap", "sleep 30") for _ in range(3)]
    assert {cluster.wait_state(j, "RUNNING")["node_list"][0] for j in jobs} == {"node2"}
    refused = cluster.gq("submit", "-p", "gpu", "--wrap", "true")
    assert refused.returncode == 1
    assert "invalid partition 'gpu'; known: big, small" in refused.stderr
    over = cluster.gq("submit", "-p", "small", "-t", "1:00:00", "--wrap", "true")
    assert over.returncode == 1 and "partition's maximum of 00:10:00" in over.stderr
    test = cluster.gq("submit", "--test-only", "-p", "big", "-g", "2", "--wrap", "true")
    assert test.returncode == 0, test.stderr
    assert " using 1 processors on nodes node1 in partition big" in test.stdout
    assert test.stdout.startswith(f"Job {jobs[-1] + 1} to start at ")
    cluster.gq("cancel", *map(str, jobs), check=True)


#: The batch environment the Slurm 22.05 peer gave the Princeton DDP script (corpus case 02:
#: -N 2 --ntasks-per-node 2 -c 8 --mem 32G --gres gpu:2) on its first node, less what differs
#: by site (names, paths, ids, pids).
PEER_BATCH_ENV = {
    "ENVIRONMENT": "BATCH", "SLURM_CPUS_ON_NODE": "16", "SLURM_CPUS_PER_TASK": "8",
    "SLURM_GPUS_ON_NODE": "2", "SLURM_GTIDS": "0", "SLURM_JOB_CPUS_PER_NODE": "16(x2)",
    "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_NAME": "ddp-torch", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_QOS": "normal", "SLURM_LOCALID": "0",
    "SLURM_MEM_PER_NODE": "32768", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
    "SLURM_NODE_ALIASES": "(null)", "SLURM_NPROCS": "4", "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2", "SLURM_PRIO_PROCESS": "0", "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
    "CUDA_VISIBLE_DEVICES": "0,1", "GPU_DEVICE_ORDINAL": "0,1", "ROCR_VISIBLE_DEVICES": "0,1",
    "ZE_AFFINITY_MASK": "0,1",
}
#: Every variable the peer set for that batch script; those gq has no meaning for are left
#: out (SLURM_WORKING_CLUSTER: slurmctld's address; SLURM_CONF: its config file).
PEER_BATCH_NAMES = {
    "CUDA_VISIBLE_DEVICES", "ENVIRONMENT", "GPU_DEVICE_ORDINAL", "HOSTNAME",
    "ROCR_VISIBLE_DEVICES", "SLURMD_NODENAME", "SLURM_CLUSTER_NAME", "SLURM_CPUS_ON_NODE",
    "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_GTIDS", "SLURM_JOBID",
    "SLURM_JOB_ACCOUNT", "SLURM_JOB_CPUS_PER_NODE", "SLURM_JOB_GID", "SLURM_JOB_GPUS",
    "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES",
    "SLURM_JOB_PARTITION", "SLURM_JOB_QOS", "SLURM_JOB_UID", "SLURM_JOB_USER", "SLURM_LOCALID",
    "SLURM_MEM_PER_NODE", "SLURM_NNODES", "SLURM_NODEID", "SLURM_NODELIST",
    "SLURM_NODE_ALIASES", "SLURM_NPROCS", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
    "SLURM_PRIO_PROCESS", "SLURM_PROCID", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST",
    "SLURM_TASKS_PER_NODE", "SLURM_TASK_PID", "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN", "ZE_AFFINITY_MASK",
}


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_a_slurm_script_gets_slurms_environment_and_commands(tmp_path: Path) -> None:
    live = prepare(tmp_path)
    with running(live, nodes=2, up_args=("--cpus", "32", "--mem", "64G")):
        script = live.work / "ddp.sbatch"
        script.write_text(
            "#!/bin/bash\n#SBATCH --job-name=ddp-torch\n#SBATCH --nodes=2\n"
            "#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=8\n#SBATCH --mem=32G\n"
            "#SBATCH --gres=gpu:2\n#SBATCH --time=00:05:00\nset -u\n"
            "env > env.$SLURMD_NODENAME\n"
            'echo "cpus=$SLURM_CPUS_PER_TASK tasks=$SLURM_NTASKS"\n'
            'squeue -u "$USER" -h -o "%i %T"\n'
            'scontrol show hostnames "$SLURM_JOB_NODELIST"\n'
            'echo "master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
            "srun --ntasks-per-node 1 sh -c 'env > step-env.$SLURMD_NODENAME'\n")
        sbatch = live.gq("compat", "--dir", str(tmp_path / "bin"))  # gq's sbatch, for the test
        assert sbatch.returncode == 0 and f'export PATH="{tmp_path / "bin"}:$PATH"' in \
            sbatch.stdout
        out = _sh(live, tmp_path, f"sbatch {script}")
        assert out.returncode == 0, out.stderr
        job_id = int(out.stdout.removeprefix("Submitted batch job "))
        live.wait_state(job_id, "COMPLETED")
        env = _env(live.work / "env.node1")
        assert {k: env.get(k) for k in PEER_BATCH_ENV} == PEER_BATCH_ENV
        assert PEER_BATCH_NAMES <= set(env), PEER_BATCH_NAMES - set(env)
        assert (env["SLURM_JOB_NODELIST"], env["SLURMD_NODENAME"], env["HOSTNAME"]) == \
            ("node[1-2]", "node1", "node1")
        assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == str(job_id)
        assert env["PATH"].split(":")[0].endswith("/slurm-bin")
        # The script ran once, on the first node (Slurm's); a step reaches the second.
        assert not (live.work / "env.node2").exists()
        step = _env(live.work / "step-env.node2")
        assert (step["SLURM_NODEID"], step["SLURMD_NODENAME"], step["SLURM_STEP_ID"],
                step["SLURM_PROCID"], step["SLURM_JOB_ID"]) == ("1", "node2", "0", "1",
                                                                 str(job_id))
        # The batch script's output: Slurm's file name; squeue and scontrol inside the job.
        text = (live.work / f"slurm-{job_id}.out").read_text()
        assert "cpus=8 tasks=4\n" in text and f"{job_id} RUNNING\n" in text
        assert "node1\nnode2\nmaster=node1\n" in text


def _sh(live: LiveCluster, tmp_path: Path, command: str) -> subprocess.CompletedProcess[str]:
    """A shell command of a user who ran `eval "$(gq compat)"`."""
    env = {**live.env, "PATH": f"{tmp_path / 'bin'}:{live.env['PATH']}"}
    return subprocess.run(["bash", "-c", command], env=env, cwd=live.work, capture_output=True,
                          text=True, timeout=60)


def test_slurm_commands_against_live_daemons(cluster: LiveCluster, tmp_path: Path) -> None:
    assert cluster.gq("compat", "--dir", str(tmp_path / "bin")).returncode == 0
    first = _sh(cluster, tmp_path, "sbatch --parsable -J keep -t 10 --wrap 'sleep 300'")
    assert first.returncode == 0, first.stderr
    keep = int(first.stdout)
    held = [int(_sh(cluster, tmp_path, f"sbatch --parsable -H -J {name} --wrap true").stdout)
            for name in ("drop", "drop", "other")]
    cluster.wait_state(keep, "RUNNING")
    assert cluster.show(keep)["gpus_per_node"] == 0  # sbatch asks for no GPU by default
    listed = _sh(cluster, tmp_path, "squeue -h -o '%i %j %T' -u $(id -un)")
    assert listed.stdout.splitlines() == [f"{held[0]} drop PENDING", f"{held[1]} drop PENDING",
                                          f"{held[2]} other PENDING", f"{keep} keep RUNNING"]
    # scancel by name and state: only the pending "drop" jobs.
    assert _sh(cluster, tmp_path, "scancel -t PD -n drop").returncode == 0
    wait_for(lambda: [cluster.show(j)["state"] for j in held] ==
             ["CANCELLED", "CANCELLED", "PENDING"], "the two drop jobs to be cancelled")
    assert _sh(cluster, tmp_path, "scancel 99999").returncode == 0  # Slurm's: silently
    show = _sh(cluster, tmp_path, f"scontrol show job {keep}")
    assert show.stdout.startswith(f"JobId={keep} JobName=keep\n") and \
        "   JobState=RUNNING Reason=None Dependency=(null)\n" in show.stdout
    assert _sh(cluster, tmp_path, f"scontrol release {held[2]}").returncode == 0
    cluster.wait_state(held[2], "COMPLETED")
    acct = _sh(cluster, tmp_path, f"sacct -P -n -o JobID,JobName,State,ExitCode -j {held[2]}")
    assert acct.stdout == f"{held[2]}|other|COMPLETED|0:0\n"
    info = _sh(cluster, tmp_path, "sinfo -h -N -o '%N %t'")
    assert sorted(info.stdout.splitlines()) == ["node1 mix", "node2 idle"] or \
        sorted(info.stdout.splitlines()) == ["node1 idle", "node2 mix"]
    test = _sh(cluster, tmp_path, "sbatch --test-only -c 1 --wrap true")
    assert test.returncode == 0 and test.stdout == ""
    assert re.fullmatch(r"sbatch: Job \d+ to start at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d using 1 "
                        r"processors on nodes node[12] in partition gpu\n", test.stderr), test.stderr
    refused = _sh(cluster, tmp_path, "sbatch --gres=gpu:9 --wrap true")
    assert refused.returncode == 1 and refused.stderr.startswith(
        "sbatch: error: Batch job submission failed: no node can ever run this job: it asks "
        "for 9 GPU(s)")
    assert _sh(cluster, tmp_path, f"scancel {keep}").returncode == 0
    cluster.wait_state(keep, "CANCELLED")


def test_gq_cancels_lists_and_reports_by_filters(cluster: LiveCluster) -> None:
    jobs = {name: cluster.submit("-H", "-J", name, "--wrap", "true")
            for name in ("sweep", "keep", "odd|name")}
    extra = cluster.submit("-H", "-J", "sweep", "--wrap", "true")
    listed = cluster.gq("queue", "-j", f"{jobs['sweep']},{extra}", "-o", "%i %j %T", check=True)
    assert listed.stdout == (f"JOBID NAME STATE\n{jobs['sweep']} sweep PENDING\n"
                             f"{extra} sweep PENDING\n")
    done = cluster.gq("cancel", "-n", "sweep", "-t", "PD", check=True)
    assert "cancelled 2 job(s)" in done.stderr
    assert [cluster.show(j)["state"] for j in (jobs["sweep"], extra, jobs["keep"])] == \
        ["CANCELLED", "CANCELLED", "PENDING"]
    assert "no live job matches" in cluster.gq("cancel", "-n", "sweep", check=True).stderr
    assert cluster.gq("cancel").returncode == 2  # nothing named
    history = cluster.gq("history", "-p", "-j", str(jobs["sweep"]), check=True).stdout
    assert history.splitlines()[1].split("|")[:6] == [str(jobs["sweep"]), "sweep",
                                                      cluster.show(extra)["user"], "",
                                                      "normal", "CANCELLED"]
    # --parsable: a '|' in a value is written as '/', so that every line splits alike.
    rows = cluster.gq("queue", "-p", "-j", str(jobs["odd|name"]), check=True).stdout
    assert rows.splitlines()[1].split("|")[1] == "odd/name"
    assert cluster.gq("queue", "--json", "-j", str(jobs["odd|name"]),
                      check=True).stdout.count('"odd|name"') == 1
    cluster.gq("cancel", str(jobs["keep"]), str(jobs["odd|name"]), check=True)
