"""The batch environment (gq/node/slurmenv.py) has the SLURM_* variables, and values, that the
real Slurm 22.05 peer gave batch scripts of the same requests on 32-CPU, 8-GPU nodes (captured
with `env` in each script; ../shared/peers/slurm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gq.messages import ArrayTask, Launch, RunSpec
from gq.node.slurmenv import array_range, batch_env, tasks_per_node
from gq.slurm import shims
from gq.tasks import Capacity, resolve
from tests.test_slurm_requests import _request

NODE = Capacity(gpus=8, cpus=32, mem=64000 << 20)
#: Request -> the peer's SLURM_* variables that depend on it (all of them present, with
#: these values), and those it did not set.
CASES: list[tuple[list[str], dict[str, str], set[str]]] = [
    (["-N", "1", "--gpus", "1"],
     {"SLURM_CPUS_ON_NODE": "1", "SLURM_GPUS": "1", "SLURM_GPUS_ON_NODE": "1",
      "SLURM_JOB_CPUS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1", "SLURM_NNODES": "1"},
     {"SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_PER_NODE"}),
    (["-N", "1", "--cpus-per-gpu", "2", "--gres", "gpu:1"],
     {"SLURM_CPUS_ON_NODE": "2", "SLURM_CPUS_PER_GPU": "2", "SLURM_GPUS_ON_NODE": "1",
      "SLURM_JOB_CPUS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2"}, {"SLURM_NTASKS"}),
    (["-n", "3", "--gres", "gpu:1"],
     {"SLURM_CPUS_ON_NODE": "3", "SLURM_NTASKS": "3", "SLURM_NPROCS": "3",
      "SLURM_TASKS_PER_NODE": "3", "SLURM_JOB_CPUS_PER_NODE": "3"}, {"SLURM_CPUS_PER_TASK"}),
    (["-N", "2"], {"SLURM_CPUS_ON_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "1(x2)",
                   "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NNODES": "2"},
     {"SLURM_NTASKS", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"}),
    # Slurm lays out 2 then 1 (SLURM_JOB_CPUS_PER_NODE 4,2); gq holds 4 CPUs on both.
    (["-n", "3", "-c", "2", "-N", "2"],
     {"SLURM_CPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "2", "SLURM_NTASKS": "3",
      "SLURM_TASKS_PER_NODE": "2,1"}, set()),
    (["--gpus-per-task", "2", "-n", "2"],
     {"SLURM_CPUS_ON_NODE": "2", "SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_TASK": "2",
      "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_GPUS": "0,1,2,3"},
     {"SLURM_GPUS_PER_NODE"}),
    (["--open-mode", "truncate"], {"SLURM_OPEN_MODE": "t"}, set()),
    (["--mem-per-cpu", "100", "-c", "3"],
     {"SLURM_MEM_PER_CPU": "100", "SLURM_CPUS_ON_NODE": "3", "SLURM_CPUS_PER_TASK": "3"},
     {"SLURM_MEM_PER_NODE"}),
    (["--mem-per-gpu", "100", "--gres", "gpu:2"],
     {"SLURM_MEM_PER_GPU": "100", "SLURM_GPUS_ON_NODE": "2"}, {"SLURM_MEM_PER_NODE"}),
    (["--exclusive"], {"SLURM_CPUS_ON_NODE": "32", "SLURM_GPUS_ON_NODE": "8",
                       "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "SLURM_TASKS_PER_NODE": "32"},
     set()),
    (["--gpus-per-task", "l40s:1", "-n", "1", "--mem-per-gpu", "16G"],
     {"SLURM_GPUS_PER_TASK": "l40s:1", "SLURM_MEM_PER_GPU": "16384"}, set()),
]


def _env(words: list[str], rank: int = 0, job: dict[str, Any] | None = None) -> dict[str, str]:
    spec = resolve(_request(words, "#!/bin/sh\n#SBATCH -t 5\ntrue\n"), [NODE], 1, [])
    spec.update(user="root", uid=0, gid=0, qos="normal", partition="gpu")
    names = [f"n{i + 1}" for i in range(spec["nodes"])]
    return batch_env(Launch(job_id=13, restart=0, spec=RunSpec.of(spec), gpus=tuple(range(spec["gpus"])),
                            rank=rank, nodelist=tuple(names), time_limit_s=0, stdout="/o",
                            stderr="/e", job=ArrayTask(**(job or {})), cluster="gqpeer"))


@pytest.mark.parametrize("words,expected,absent", CASES, ids=lambda c: " ".join(c)
                         if isinstance(c, list) else "")
def test_the_batch_environment_is_the_peers(words: list[str], expected: dict[str, str],
                                            absent: set[str]) -> None:
    env = _env(words)
    assert {k: env.get(k) for k in expected} == expected
    assert not absent & set(env), absent & set(env)
    # What the peer set for every batch script.
    assert {k: env[k] for k in ("SLURM_GTIDS", "SLURM_NODE_ALIASES", "SLURM_PRIO_PROCESS",
                                "SLURM_PROCID", "SLURM_LOCALID", "SLURM_TOPOLOGY_ADDR_PATTERN",
                                "ENVIRONMENT", "SLURM_CLUSTER_NAME", "SLURM_JOBID")} == \
        {"SLURM_GTIDS": "0", "SLURM_NODE_ALIASES": "(null)", "SLURM_PRIO_PROCESS": "0",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
         "ENVIRONMENT": "BATCH", "SLURM_CLUSTER_NAME": "gqpeer", "SLURM_JOBID": "13"}


def test_only_a_requeued_job_has_a_restart_count() -> None:
    assert "SLURM_RESTART_COUNT" not in _env(["-N", "1"])  # the peer's first runs: none
    spec = resolve(_request(["-N", "1"], "#!/bin/sh\ntrue\n"), [NODE], 1, [])
    spec.update(user="root", uid=0, gid=0)
    env = batch_env(Launch(job_id=13, restart=2, spec=RunSpec.of(spec), gpus=(), rank=0, nodelist=("n1",),
                           time_limit_s=0, stdout="/o", stderr="/e", job=ArrayTask()))
    assert env["SLURM_RESTART_COUNT"] == "2"


def test_nodes_and_arrays_in_slurms_forms() -> None:
    env = _env(["-N", "2"], rank=1)
    assert (env["SLURM_JOB_NODELIST"], env["SLURM_NODELIST"], env["SLURMD_NODENAME"],
            env["SLURM_NODEID"], env["HOSTNAME"]) == ("n[1-2]", "n[1-2]", "n2", "1", "n2")
    assert array_range("1-5") == {"SLURM_ARRAY_TASK_COUNT": "5", "SLURM_ARRAY_TASK_MIN": "1",
                                  "SLURM_ARRAY_TASK_MAX": "5", "SLURM_ARRAY_TASK_STEP": "1"}
    assert array_range("0-10:5%2")["SLURM_ARRAY_TASK_STEP"] == "5"
    assert array_range("1,2,4") == {"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
                                    "SLURM_ARRAY_TASK_MAX": "4", "SLURM_ARRAY_TASK_STEP": "1"}
    task = _env(["-a", "1-5"], job={"array_job_id": 12, "array_index": 3})
    assert (task["SLURM_ARRAY_JOB_ID"], task["SLURM_ARRAY_TASK_ID"],
            task["SLURM_ARRAY_TASK_COUNT"]) == ("12", "3", "5")
    assert tasks_per_node(RunSpec.of({"script": "", "ntasks": 5, "ntasks_per_node": 2}), 3) == [2, 2, 1]


def test_a_job_keeps_the_home_it_was_submitted_with_and_its_identity_from_passwd() -> None:
    """As Slurm: HOME is the submitter's (a login shell's ~/.bash_profile is the one the user
    meant: corpus 27); the passwd entry's only when none came. USER and LOGNAME are who the job
    runs as, whatever the environment said."""
    import pwd

    from gq.node.runfiles import RunOrder
    from gq.node.shepherd import job_env
    me = pwd.getpwuid(0)
    spec = resolve(_request(["-N", "1"], "#!/bin/sh\ntrue\n"), [NODE], 1, [])

    def env_of(submitted: dict[str, str]) -> dict[str, str]:
        spec.update(user="root", uid=0, gid=0, env=submitted)
        launch = Launch(job_id=13, restart=0, spec=RunSpec.of(spec), gpus=(), rank=0, nodelist=("n1",),
                        time_limit_s=0, stdout="/o", stderr="/e", job=ArrayTask())
        return job_env(RunOrder(launch=launch, isolation={}))

    kept = env_of({"HOME": "/site/home", "SHELL": "/bin/zsh", "USER": "mallory", "PATH": "/bin"})
    assert (kept["HOME"], kept["SHELL"], kept["USER"], kept["LOGNAME"]) == (
        "/site/home", "/bin/zsh", me.pw_name, me.pw_name)
    plain = env_of({"PATH": "/bin"})
    assert (plain["HOME"], plain["SHELL"]) == (me.pw_dir, me.pw_shell or "/bin/sh")


def test_a_login_shells_profile_does_not_lose_gqs_slurm_commands(tmp_path: Path) -> None:
    """`#!/bin/bash -l`: /etc/profile sets PATH anew; the job's BASH_ENV puts gq's srun first
    again, then sources the job's own BASH_ENV once (not a gq job's, which would loop)."""
    import subprocess

    from gq.node.runfiles import RunOrder
    from gq.node.shepherd import job_env
    spec = resolve(_request(["-N", "1"], "#!/bin/sh\ntrue\n"), [NODE], 1, [])
    bin_dir = str(shims.ensure(tmp_path / "slurm-bin"))
    own = tmp_path / "own.sh"
    own.write_text("echo own-bash-env >&2\n")

    def env_of(submitted: dict[str, str]) -> dict[str, str]:
        spec.update(user="root", uid=0, gid=0, env=submitted)
        launch = Launch(job_id=13, restart=0, spec=RunSpec.of(spec), gpus=(), rank=0,
                        nodelist=("n1",), time_limit_s=0, stdout="/o", stderr="/e",
                        job=ArrayTask())
        return job_env(RunOrder(launch=launch, isolation={}), bin_dir)

    env = env_of({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BASH_ENV": str(own)})
    assert env["GQ_BASH_ENV"] == str(own)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash -l\nset -u\ncommand -v srun\n")
    script.chmod(0o755)
    ran = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout == f"{bin_dir}/srun\n", ran
    assert ran.stderr.count("own-bash-env") == 1, ran.stderr
    # Submitted from inside a gq job: its BASH_ENV is gq's own, not chained.
    again = env_of({**env})
    assert again["BASH_ENV"] == env["BASH_ENV"] and again["GQ_BASH_ENV"] == str(own)
    ran = subprocess.run([str(script)], env=again, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stderr.count("own-bash-env") == 1, ran
