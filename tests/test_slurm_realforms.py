"""Forms from real `#SBATCH` scripts outside the corpus that gq refused or misread (issue 15:
"they will also be checked against real scripts that are not in the repository"), each run
with gq's own sbatch on a live cluster, as the scripts were:

- `--array=[0-2]%2` (a script's brackets: Slurm drops them) with `-o slurm_output/%J.out`
  (%J is the job id for the batch script: every task wrote one literal `%J.out` before);
- `#SBATCH --err=err` / `--out=out` (getopt_long's unique prefixes: the output went to
  slurm-N.out);
- `srun -n 2 --cpu_bind=cores -G 2 --gpu-bind=single:1` (srun refused the old spelling);
- `scontrol show jobid $SLURM_JOB_ID` (an entity prefix scontrol takes) and `sacct -j` of
  an array task's step, named `A_I.0` as Slurm's sacct names it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import LiveCluster, wait_for


def _sbatch(cluster: LiveCluster, bin_dir: Path, script: str, cwd: Path) -> str:
    path = cwd / "job.sbatch"
    path.write_text(script)
    env = dict(cluster.env, PATH=f"{bin_dir}:{os.environ['PATH']}")
    out = subprocess.run(["sbatch", "--parsable", str(path)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def _sacct(cluster: LiveCluster, bin_dir: Path, job: str) -> list[list[str]]:
    env = dict(cluster.env, PATH=f"{bin_dir}:{os.environ['PATH']}")
    out = subprocess.run(["sacct", "-P", "-n", "-j", job, "-o", "JobID,JobIDRaw,State"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line.split("|") for line in out.stdout.splitlines()]


def _ended(cluster: LiveCluster, bin_dir: Path, job: str, rows: int) -> list[list[str]]:
    """sacct's rows of `job` (tasks and steps) once there are `rows` of them, all ended."""
    def check() -> list[list[str]] | None:
        got = _sacct(cluster, bin_dir, job)
        return got if len(got) == rows and all(
            r[2] not in ("PENDING", "RUNNING") for r in got) else None
    return wait_for(check, f"job {job}'s {rows} rows to end", 120)


def test_real_scripts_forms_run_to_completed(cluster: LiveCluster, tmp_path: Path) -> None:
    bin_dir = tmp_path / "slurm-bin"
    assert cluster.gq("compat", "--dir", str(bin_dir)).returncode == 0
    arr, flat = tmp_path / "arr", tmp_path / "flat"
    for d in (arr / "slurm_output", flat):  # Slurm makes no directory for -o: the script's
        d.mkdir(parents=True)             # user had made it
    array_id = _sbatch(cluster, bin_dir, (
        "#!/bin/bash\n#SBATCH --array=[0-2]%2\n#SBATCH --gres=gpu:1\n"
        "#SBATCH -o ./slurm_output/%J.out\n"
        "srun -n 1 --cpu_bind=cores bash -c 'echo task=$SLURM_ARRAY_TASK_ID id=$SLURM_JOB_ID'\n"
    ), arr)
    flat_id = _sbatch(cluster, bin_dir, (
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus=2\n#SBATCH --err=err\n#SBATCH --out=out\n"
        "set -euo pipefail\n"
        "scontrol show jobid $SLURM_JOB_ID | grep -q \"JobId=$SLURM_JOB_ID \"\n"
        "srun -n 2 --cpu_bind=cores -G 2 --gpu-bind=single:1 bash -c 'echo rank=$SLURM_PROCID'\n"
        "echo done >&2\n"), flat)

    rows = _ended(cluster, bin_dir, array_id, 6)  # three tasks, a step each
    tasks = {r[0]: r for r in rows if "." not in r[0]}
    assert sorted(tasks) == [f"{array_id}_{i}" for i in range(3)], rows
    assert all(r[2] == "COMPLETED" for r in rows), rows
    for name, (_, raw, _) in tasks.items():  # each task's step by the task's name, raw id
        assert [name + ".0", raw + ".0", "COMPLETED"] in rows, rows
        text = (arr / "slurm_output" / f"{raw}.out").read_text()
        assert text == f"task={name.split('_')[1]} id={raw}\n", text
    assert sorted(p.name for p in (arr / "slurm_output").iterdir()) == sorted(
        f"{r[1]}.out" for r in tasks.values())

    flat_rows = _ended(cluster, bin_dir, flat_id, 2)
    assert flat_rows == [[flat_id, flat_id, "COMPLETED"], [f"{flat_id}.0", f"{flat_id}.0",
                                                          "COMPLETED"]], flat_rows
    assert sorted((flat / "out").read_text().split()) == ["rank=0", "rank=1"]
    assert (flat / "err").read_text() == "done\n"
    assert not list(flat.glob("slurm-*.out"))
