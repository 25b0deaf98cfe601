"""What gq does differently from Slurm 22.05 with the corpus scripts (tests/slurm_corpus/), for
tests/test_slurm_corpus.py: each difference with its reason, exact, so that one that no longer
holds fails the case it is listed for. The report of issue 15 lists them too; fix gq and drop
the entry, or keep it and say why here."""

from __future__ import annotations

#: Cases gq does not run to the end as Slurm does: the symptom each shows in its output (a
#: regular expression) and why. The case's test checks the symptom and then xfails; a gq that
#: runs the case to COMPLETED fails it until the entry is removed.
EXPECTED_FAILURES: dict[str, tuple[str, str]] = {
}

R_ACCOUNT = ("gq has no default account: sacct shows none for a job that named none (Slurm: "
             "the user's DefaultAccount, `root` on the peer); SLURM_JOB_ACCOUNT does fall back "
             "to the user's name")
R_GRES = ("gq's job spec keeps one GPUs-per-node count for --gres and --gpus-per-node alike, "
          "so it sets SLURM_GPUS_PER_NODE for both; Slurm only for --gpus-per-node")
R_DEFMEM = ("the peer's DefMemPerCPU=4000 gives a job that asks for no memory 4000 MB a CPU "
            "(SLURM_MEM_PER_CPU, and mem= in its AllocTRES); gq has no such site default")
R_PARTITIONS = ("`-p owners,normal`: gq keeps the list and places the job on the union of their "
                "nodes, so sacct shows the list; Slurm shows the one partition the job ran in "
                "(SLURM_JOB_PARTITION, the list's first in gq, agrees here)")
R_NO_GPU = ("a job that holds no GPU gets an empty CUDA_VISIBLE_DEVICES from gq (CUDA then uses "
            "none even where devices are not confined); Slurm leaves it unset")
R_CORES = ("Slurm set SLURM_NTASKS=SLURM_NPROCS=1 for this script, which names no task count "
           "(`--nodes=1 --cores=1`, `--cores` being sbatch's abbreviation of "
           "--cores-per-socket, which gq ignores with a warning); gq sets them only for -n or "
           "--ntasks-per-node")

R_EXCLUSIVE_MEM = ("an --exclusive job holds all of a node's memory in gq (2 500 000 MB); Slurm "
                   "gives it memory for its CPUs only (DefMemPerCPU or --mem-per-cpu times 192)")
R_MEM0 = ("`--mem=0`: Slurm allocates all of each node's memory (mem= in AllocTRES); gq records "
          "no memory request (the job is not limited either way)")

#: Variables Slurm's srun sets in every task that gq's steps do not (checked in the cases that
#: run srun, as DIFFERENCES entries of value None): the task layout's name (block, cyclic),
#: srun's umask, and the one-component heterogeneous job's copy of SLURM_JOB_CPUS_PER_NODE.
STEP_UNSET: dict[str, str] = {
    "SLURM_DISTRIBUTION": "gq lays steps out as Slurm's default (block) without naming it",
    "SLURM_UMASK": "srun passes its umask in SLURM_UMASK; gq's steps run with the job's",
    "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0": "a heterogeneous-job variable; gq has none",
}

R_STEP_ENV = ("the tasks of srun in this --exclusive job keep the batch script's "
              "SLURM_GPUS_PER_NODE and SLURM_MEM_PER_NODE in gq (srun passes its environment "
              "on, and gq's steps set neither anew); Slurm's tasks had neither")
R_TRES_BIND = ("Slurm binds each task of `--gpus-per-task` to its GPU itself (SLURMD_TRES_BIND); "
               "the script unset CUDA_VISIBLE_DEVICES first and the peer, with no GPUs to bind, "
               "gave its tasks none; gq gives each task its own GPU (CUDA_VISIBLE_DEVICES and "
               "the like, a value per task) and has no SLURMD_TRES_BIND")
R_PER_GPU = ("--ntasks-per-gpu is accepted and ignored by gq's steps (issue 15's report): no "
             "SLURM_NTASKS_PER_GPU, SLURM_NTASKS_PER_TRES or SLURMD_TRES_BIND")

#: An entry's value for a variable gq sets in each task to a value of its own (a GPU index):
#: set, whatever it holds.
PER_TASK = "<set, a value per task>"

#: Arguments whose value the script draws at random: (case, option) -> why; compared as
#: `<random>` on both sides.
RANDOM_ARGS: dict[tuple[str, str], str] = {
    ("03-pytorch-ddp-torchrun", "--rdzv_id"): "the script passes $RANDOM",
}


def random_args(case: str, argv: list[str]) -> list[str]:
    """`argv` with the values RANDOM_ARGS names for `case` put as `<random>`."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if (case, arg) in RANDOM_ARGS:
            out[i + 1] = "<random>"
    return out


#: Where gq gives a case what Slurm does not, and why: per case, a sacct field or variable ->
#: the value gq gives every job and task of the case (None: unset; PER_TASK: set). Exact, so
#: an entry that no longer holds fails its case too.
DIFFERENCES: dict[str, dict[str, tuple[str | None, str]]] = {
    "01-princeton-single-gpu": {"Account": ("", R_ACCOUNT),
                                "SLURM_GPUS_PER_NODE": ("1", R_GRES)},
    "05-accelerate-multigpu": {"Account": ("", R_ACCOUNT), "SLURM_GPUS_PER_NODE": ("4", R_GRES),
                               "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
                               "AllocTRES": ("billing=160,cpu=160,gres/gpu=4,node=1", R_DEFMEM)},
    "24-locomoset-array": {"AllocTRES": ("billing=36,cpu=36,gres/gpu=1,node=1", R_DEFMEM)},
    "25-protein-array-constraint": {"Account": ("", R_ACCOUNT),
                                    "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
                                    "AllocTRES": ("billing=4,cpu=4,gres/gpu=1,node=1", R_DEFMEM)},
    "26-array-template-set-u": {"Account": ("", R_ACCOUNT),
                                "Partition": ("owners,normal", R_PARTITIONS),
                                "CUDA_VISIBLE_DEVICES": ("", R_NO_GPU),
                                "SLURM_NTASKS": (None, R_CORES), "SLURM_NPROCS": (None, R_CORES)},
    "27-princeton-fsdp-constraint": {"Account": ("", R_ACCOUNT),
                                     "SLURM_GPUS_PER_NODE": ("4", R_GRES)},
    # The cases that run srun, as gq's steps (branch steps15) ran them; what the steps do not
    # do yet (a step missing, srun refusing an option) is no entry here.
    "02-princeton-ddp-2node": {"Account": ("", R_ACCOUNT), "SLURM_GPUS_PER_NODE": ("2", R_GRES)},
    "03-pytorch-ddp-torchrun": {
        "Account": ("", R_ACCOUNT), "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
        "AllocTRES": ("billing=16,cpu=16,gres/gpu=4,node=4", R_DEFMEM)},
    "04-torchtitan-multinode": {
        "Account": ("", R_ACCOUNT), "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
        "AllocTRES": ("billing=384,cpu=384,gres/gpu=32,node=4", R_DEFMEM)},
    "06-accelerate-multinode": {
        "Account": ("", R_ACCOUNT), "SLURM_GPUS_PER_NODE": ("4", R_GRES),
        "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
        "AllocTRES": ("billing=640,cpu=640,gres/gpu=16,node=4", R_DEFMEM)},
    "07-ray-cluster": {"Account": ("", R_ACCOUNT), "CUDA_VISIBLE_DEVICES": ("", R_NO_GPU)},
    "08-llmc-srun-label": {
        "Account": ("", R_ACCOUNT), "SLURM_GPUS_PER_NODE": ("8", R_GRES),
        "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
        "AllocTRES": ("billing=16,cpu=16,gres/gpu=16,node=2", R_DEFMEM)},
    "09-stas-torchrun-launcher": {
        "Account": ("", R_ACCOUNT), "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
        "SLURM_GPUS_PER_NODE": ("8", R_STEP_ENV), "SLURM_MEM_PER_NODE": ("2500000", R_STEP_ENV),
        "AllocTRES": ("billing=384,cpu=384,gres/gpu=16,mem=5000000M,node=2", R_EXCLUSIVE_MEM)},
    "10-stas-srun-launcher": {
        "Account": ("", R_ACCOUNT), "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
        "SLURM_GPUS_PER_NODE": ("8", R_STEP_ENV), "SLURM_MEM_PER_NODE": ("2500000", R_STEP_ENV),
        "AllocTRES": ("billing=384,cpu=384,gres/gpu=16,mem=5000000M,node=2", R_EXCLUSIVE_MEM)},
    "11-nanotron-train": {
        "Account": ("", R_ACCOUNT), "SLURM_GPUS_PER_NODE": ("8", R_STEP_ENV),
        "AllocTRES": ("billing=384,cpu=384,gres/gpu=16,mem=5000000M,node=2", R_EXCLUSIVE_MEM)},
    "12-mila-single-gpu": {"Account": ("", R_ACCOUNT)},
    "13-mila-multi-gpu-conda": {
        "Account": ("", R_ACCOUNT), "SLURMD_TRES_BIND": (None, R_TRES_BIND),
        **{key: (PER_TASK, R_TRES_BIND) for key in (
            "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
            "SLURM_STEP_GPUS", "ZE_AFFINITY_MASK")}},
    "14-mila-multi-node": {"Account": ("", R_ACCOUNT)},
    "15-mila-checkpointing": {"Account": ("", R_ACCOUNT)},
    "16-mila-job-array": {"Account": ("", R_ACCOUNT)},
    "17-mila-many-tasks-per-gpu": {
        "Account": ("", R_ACCOUNT), "SLURM_GPUS_PER_NODE": ("l40s:1", R_GRES),
        **{key: (None, R_PER_GPU) for key in (
            "SLURMD_TRES_BIND", "SLURM_NTASKS_PER_GPU", "SLURM_NTASKS_PER_TRES")}},
    "18-csc-gpu4": {"SLURM_GPUS_PER_NODE": ("v100:4", R_GRES),
                    "AllocTRES": ("billing=40,cpu=40,gres/gpu=4,node=1", R_MEM0)},
    "19-csc-ddp-torchrun-2node": {"SLURM_GPUS_PER_NODE": ("v100:4", R_GRES),
                                  "AllocTRES": ("billing=80,cpu=80,gres/gpu=8,node=2", R_MEM0)},
    "20-csc-gpu8-mahti": {"SLURM_GPUS_PER_NODE": ("a100:4", R_GRES),
                          "AllocTRES": ("billing=80,cpu=80,gres/gpu=8,node=2", R_MEM0)},
    "21-lightning-multinode": {"Account": ("", R_ACCOUNT), "SLURM_GPUS_PER_NODE": ("2", R_GRES),
                               "AllocTRES": ("billing=4,cpu=4,gres/gpu=4,node=2", R_MEM0)},
    "22-ctnvae-signal-requeue": {
        "SLURM_MEM_PER_CPU": (None, R_DEFMEM),
        "AllocTRES": ("billing=128,cpu=128,gres/gpu=4,node=1", R_DEFMEM)},
    "23-bci-2x4": {"Account": ("", R_ACCOUNT)},
}

#: Variables the peer set that mean nothing on a gq site, or whose value is the peer's own:
#: its config file and controller address, its TaskProlog's mark, the pid of one process, the
#: host all its daemons ran on (127.0.0.1) and the ports of its srun's listeners.
NOT_COMPARED = {"SLURM_CONF", "SLURM_WORKING_CLUSTER", "SLURM_SCRIPT_CONTEXT", "SLURM_TASK_PID",
                "SLURM_SUBMIT_HOST", "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT",
                "SLURM_STEP_LAUNCHER_PORT", "SLURM_LAUNCH_NODE_IPADDR"}
#: GPU index lists: compared by their number (tests/test_slurm_corpus.py's docstring says why).
GPU_LISTS = {"CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
             "ZE_AFFINITY_MASK", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"}
