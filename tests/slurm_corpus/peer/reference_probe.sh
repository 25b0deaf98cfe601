#!/usr/bin/env bash
# Record Slurm 22.05's own behaviour and formats on the corpus peer, for
# docs/research/slurm-reference.md: every command with its exact output and exit status.
#   ./start.sh && bash reference_probe.sh > ../../../docs/research/slurm-22.05-transcript.txt; ./stop.sh
# (site A). Runs in /tmp/corpus-probe; takes about 4 minutes (two jobs run into a 1-minute limit).
set -u
export USER="${USER:-$(id -un)}"
source "${CORPUS_SLURM_RUN:-/tmp/corpus-slurm-run}/env.sh"
P=/tmp/corpus-probe; rm -rf "$P"; mkdir -p "$P"; cd "$P"
export PATH="$(cd "$(dirname "$0")/.." && pwd)/bin:$PATH"
run() { echo "\$ $*"; eval "$@" 2>&1; echo "[rc=$?]"; echo; }
section() { echo; echo "################ $*"; echo; }
waitjob() { for _ in $(seq 200); do [[ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ]] && break; sleep 0.5; done; sleep 2; }
show() { for f in "$@"; do echo "----- file $f"; cat "$f"; done; echo; }
# envf: the Slurm-related part of an environment, sorted (a file on PATH, so that sh and
# srun tasks find it too)
printf '%s\n' '#!/bin/sh' "grep -E '^(SLURM|SLURMD|CUDA_VISIBLE|GPU_DEVICE|ROCR|ZE_AFF|ENVIRONMENT|HOSTNAME|TMPDIR|PMI|OMPI)' | grep -v -E '^(SLURM_SCRIPT_CONTEXT|SLURM_CONF)=' | sort" > "$P/envf"
chmod +x "$P/envf"; export PATH="$P:$PATH"

section "0. cluster"
run sinfo
run "sinfo -N -o '%N %P %T %G'"
run "sinfo -s"
run "scontrol show node n1"
run "scontrol show partition gpu"
run "scontrol show hostnames 'n[1-3,5]'"
run "scontrol show hostnames n1,n2"
run "scontrol show hostlist n1,n2,n3,n5"
run "scontrol show hostlistsorted n3,n1,n2"
run "SLURM_JOB_NODELIST='n[1-2]' scontrol show hostnames"
run "scontrol show hostnames"

section "1. long jobs started first: TIMEOUT with a step, --signal, requeue"
cat > timeout.sh <<'EOF'
#!/bin/bash
#SBATCH -t 1 -N 1 -p bf --gres=gpu:1 --signal=B:USR1@30 -J timeout-probe
trap 'echo "batch got USR1 at $(date +%s)"' USR1
echo "start $(date +%s)"
srun bash -c 'trap "echo task got TERM at \$(date +%s)" TERM; sleep 200 & wait; sleep 200 & wait'
echo "after srun rc=$?"
EOF
T=$(sbatch --parsable timeout.sh); echo "timeout job $T"
cat > requeue.sh <<'EOF'
#!/bin/bash
#SBATCH -t 5 -p bf --requeue --open-mode=append -J requeue-probe -o requeue-%j.out
echo "run SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-unset} SLURM_JOB_ID=$SLURM_JOB_ID"
sleep 20
EOF
cat > requeue-trunc.sh <<'EOF'
#!/bin/bash
#SBATCH -t 5 -p bf --requeue -J requeue-trunc -o requeue-trunc-%j.out
echo "run SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-unset}"
sleep 20
EOF
RQ=$(sbatch --parsable requeue.sh); RT=$(sbatch --parsable requeue-trunc.sh); sleep 4
run "scontrol requeue $RQ $RT"
run "squeue -j $RQ,$RT -o '%i %T %r'"
run "scontrol show job $RQ | grep -E 'JobState|Restarts|Reason'"

section "2. batch, step and task environment"
cat > envprobe.sh <<'EOF'
#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 -c 2 --gres=gpu:2 --mem-per-cpu=1000 -J envprobe -A project_2001659 -q high -p gpu -t 10
env | envf > batch.env
srun bash -c 'env | envf > step0.task$SLURM_PROCID.env'
srun -n 4 --ntasks-per-node=2 --gpus-per-task=1 bash -c 'env | envf > step1.task$SLURM_PROCID.env'
EOF
J=$(sbatch --parsable envprobe.sh); waitjob $J
show batch.env step0.task0.env step0.task3.env step1.task0.env step1.task1.env step1.task2.env
run "sacct -j $J -P --format=JobID,JobName,State,ExitCode,NNodes,NTasks,NodeList,AllocTRES"

section "2b. array job environment and output names"
A=$(sbatch --parsable --array=0-3:2 -N1 --gres=gpu:1 --wrap 'env | envf') ; waitjob $A
run "ls slurm-${A}_*"
show slurm-${A}_0.out
A2=$(sbatch --parsable --array=1-2 -o 'arr-%A_%a-%j-%x.out' -J arrname --wrap 'echo hi'); waitjob $A2
run "ls arr-*"

section "2c. salloc, srun outside an allocation, srun --pty"
run "salloc -N 2 --gres=gpu:1 -t 5 bash -c 'env | envf; srun -l hostname'"
run "srun -N 2 -n 3 --gres=gpu:1 -t 5 -l bash -c 'env | envf | grep -E \"PROCID|LOCALID|NODEID|STEP|CUDA|JOB_ID=|NTASKS|TASKS_PER|PTY\"'"
run "script -qec \"srun --pty -t 5 -n1 bash -c 'tty; env | envf | grep -E \\\"PTY|STEP_ID|JOB_ID=|LABEL\\\"'\" /dev/null"

section "3. srun task layout"
cat > layout.sh <<'EOF'
#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=4 --gres=gpu:4 -c 1 -t 10 -J layout
p() { srun "$@" bash -c 'echo "procid=$SLURM_PROCID localid=$SLURM_LOCALID nodeid=$SLURM_NODEID node=$SLURMD_NODENAME cvd=${CUDA_VISIBLE_DEVICES-unset} cpus=${SLURM_CPUS_PER_TASK-unset} step=$SLURM_STEP_ID ntasks=$SLURM_NTASKS tpn=$SLURM_TASKS_PER_NODE"' | sort; echo "== srun $* rc=${PIPESTATUS[0]}"; }
p
p -n 3
p -n 3 -N 2
p -n 2 --ntasks-per-node=1
p -N 1 -n 2 -c 2
p -n 8 --gpus-per-task=1
p -n 4 --ntasks-per-node=2 --gpus-per-task=1
p -n 4 --ntasks-per-node=2 --gpus-per-task=a100:1
p -n 8 --gpu-bind=closest
p -n 8 --gpu-bind=single:2
p -n 8 --gpu-bind=map_gpu:3,2,1,0
p -n 8 --gpu-bind=none
p -n 8 --gpus-per-task=1 --gpu-bind=none
p -n 2 --gres=gpu:1
p -n 2 --exclusive
p -n 9
p -n 2 --distribution=cyclic
EOF
L=$(sbatch --parsable layout.sh); waitjob $L; show slurm-$L.out

section "3b. labels, output routing, exit codes, kill-on-bad-exit"
cat > steps.sh <<'EOF'
#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=6 -t 10 -J steps -o steps-%j.out -e steps-%j.err
srun -l bash -c 'echo out$SLURM_PROCID; echo err$SLURM_PROCID >&2'
echo "== -l rc=$?"
srun --label -n 2 bash -c 'printf "no newline $SLURM_PROCID"'
echo; echo "== printf rc=$?"
srun -n 3 -o 'task-%j-%s-%t-%n-%N.out' bash -c 'echo i am $SLURM_PROCID'
echo "== -o rc=$?"
srun -n 4 bash -c 'exit $SLURM_PROCID'
echo "== exit procid rc=$?"
srun -n 4 bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 8; echo survivor $SLURM_PROCID'
echo "== one fails, no kill-on-bad-exit rc=$?"
srun -n 4 --kill-on-bad-exit=1 bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 8; echo survivor $SLURM_PROCID'
echo "== kill-on-bad-exit rc=$?"
srun -n 2 bash -c 'if [ $SLURM_PROCID = 1 ]; then kill -9 $$; fi; sleep 1'
echo "== killed by signal 9 rc=$?"
srun -n 2 --export=NONE bash -c 'echo "export=NONE: PATH=${PATH-unset} SLURM_PROCID=$SLURM_PROCID FOO=${FOO-unset}"'
FOO=bar srun -n 1 --export=ALL,BAZ=1 bash -c 'echo "export=ALL,BAZ=1: FOO=${FOO-unset} BAZ=$BAZ"'
srun -n 1 nosuchcommand
echo "== nosuchcommand rc=$?"
srun -n 1 --bogus-option true
echo "== bad option rc=$?"
srun -n 99 true
echo "== too many tasks rc=$?"
EOF
S=$(sbatch --parsable steps.sh); waitjob $S; show steps-$S.out steps-$S.err; run "ls task-*"; show task-$S-2-0-0-n1.out
run "sacct -j $S -P --format=JobID,JobName,State,ExitCode,DerivedExitCode,NTasks,NodeList"
run "sacct -j $S --format=JobID,JobName,State,ExitCode"

section "4. #SBATCH parsing, defaults, SBATCH_* input variables"
cat > parse.sh <<'EOF'
#!/bin/bash
# a comment
#SBATCH -J parse1

  #SBATCH -J indented
# SBATCH -J spaced
#SBATCH --comment="has spaces"   # trailing comment
#SBATCH -t 5
echo "first command"
#SBATCH -J after-command
echo "name=$SLURM_JOB_NAME"
EOF
PJ=$(sbatch --parsable parse.sh); waitjob $PJ; show slurm-$PJ.out; run "scontrol show job $PJ | grep -E 'JobName|Comment|TimeLimit'"
PJ2=$(sbatch --parsable -J cmdline parse.sh); waitjob $PJ2; show slurm-$PJ2.out
PJ3=$(SBATCH_JOB_NAME=fromenv SBATCH_TIMELIMIT=3 SBATCH_PARTITION=bf sbatch --parsable parse.sh); waitjob $PJ3
run "sacct -j $PJ3 -X -P -n --format=JobName,Partition,Timelimit"
printf 'echo no shebang\n' > noshebang.sh
run "sbatch noshebang.sh"
run "sbatch --wrap 'echo wrapped; env | grep -E \"^SLURM_JOB_NAME\"'"
sleep 4; run "cat slurm-*.out | grep -A1 wrapped"
run "sbatch --test-only -N 2 --gres=gpu:2 --wrap true"
run "sbatch -o 'o-%x-%u-%j-%N-%n-%t.out' -J pct --wrap 'echo pct'"
sleep 4; run "ls o-*"
run "sbatch --parsable --wrap true"
run "sbatch --parsable -M gqpeer --wrap true"
run "sbatch -M gqpeer --wrap true"
run "sbatch --export=NONE --wrap 'echo PATH=\$PATH HOME=\$HOME; env | wc -l'"
run "sbatch -D /nonexistent --wrap true"
run "sbatch -o /nonexistent/dir/x.out --wrap true"
sleep 5; run "sacct -X -n -P --format=JobID,JobName,State,ExitCode | tail -3"

section "5. rejected submissions (exact text, exit codes)"
run "sbatch --bogus --wrap true"
run "sbatch -p nosuch --wrap true"
run "sbatch -p gpu,nosuch --wrap true"
run "sbatch --qos nosuch --wrap true"
run "sbatch -A nosuch --wrap true"
run "sbatch -C nosuch --wrap true"
run "sbatch --gres=gpu:9 --wrap true"
run "sbatch --gres=gpu:h100:1 --wrap true"
run "sbatch --gpus-per-node=v100:1 --wrap true"
run "sbatch --mem=100T --wrap true"
run "sbatch -c 500 --wrap true"
run "sbatch -N 5 --wrap true"
run "sbatch -x 'cn-g[001-012]' --wrap true"
run "sbatch -w n9 --wrap true"
run "sbatch -L NOSUCH --wrap true"
run "sbatch --reservation=nosuch --wrap true"
run "sbatch --cores=1 --wrap true; sleep 1"
run "sbatch -t 0:30 --wrap true"
run "sbatch /nonexistent.sh"
run "sbatch --gres-flags=allow-task-sharing --wrap true"
run "sbatch --gpus-per-task=1 --ntasks-per-gpu=2 --wrap true"

section "6. squeue formats"
for i in 1 2; do sbatch -J held$i -H --wrap 'sleep 30' >/dev/null; done
sbatch -J run1 --gres=gpu:1 --wrap 'sleep 30' >/dev/null
sbatch -J arr --array=1-4%2 --wrap 'sleep 30' >/dev/null
sleep 3
run "squeue"
run "squeue -h -o '%i %T'"
run "squeue -u \$USER -h -o %i"
run "squeue -r -h -o '%i %T %r'"
run "squeue -o '%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R'"
run "squeue -o '%A %F %K %j %u %a %q %P %T %t %M %l %L %D %C %b %N %R %V %S %e %Z %o' -t all | head -4"
run "squeue -O 'JobID,Name:20,State,Reason,TimeLimit,NumNodes,tres-per-node' | head -5"
run "squeue -l | head -5"
run "squeue --start -h | head -3"
run "squeue -j 999999"
run "squeue -j 999999 -h -o %i; echo empty-ok"
run "squeue --bogus"
run "squeue -t PD -h -o '%i %j %T %r'"

section "7. scontrol"
H=$(squeue -h -n held1 -o %i)
run "scontrol show job $H"
run "scontrol release $H"
run "scontrol hold $H"
run "scontrol update jobid=$H TimeLimit=5 Name=renamed"
run "scontrol update jobid=$H Partition=nosuch"
run "scontrol show job $H | grep -E 'JobName|TimeLimit|JobState|Reason'"
run "scontrol requeue $H"
run "scontrol show job 999999"
run "scontrol hold 999999"
run "scontrol release 999999"
run "scontrol requeue 999999"
run "scontrol show job -o $H | head -c 400; echo"
run "scontrol show jobs | grep -c JobId"

section "8. scancel"
run "scancel 999999"
run "scancel -n held2 -v"
run "scancel -t PENDING -n arr"
run "squeue -h -o '%i %j %T'"
run "scancel -p gpu -u \$USER -t RUNNING"
run "scancel --signal=USR1 999999"
run "scancel --bogus"
run "scancel"
sleep 3; run "squeue -h -o '%i %j %T'"
run "scancel -u \$USER -p gpu"
sleep 3

section "9. job cancelled while a step runs; mail; sacct formats"
C=$(sbatch --parsable -N2 --mail-type=ALL --mail-user=someone@example.org --wrap 'srun -N2 sleep 100'); sleep 5
run "scancel $C"; waitjob $C
run "sacct -j $C -P --format=JobID,JobName,State,ExitCode,Elapsed,MaxRSS,TotalCPU"
run "grep 'Job_id=$C' ${CORPUS_SLURM_RUN:-/tmp/corpus-slurm-run}/capture/mail.log"
F=$(sbatch --parsable --wrap 'exit 7'); waitjob $F
run "sacct -j $F -P --format=JobID,JobName,State,ExitCode,DerivedExitCode"
run "sacct -j $J,$S -P --format=JobID,JobName,State,ExitCode,Elapsed,MaxRSS,TotalCPU"
run "sacct -j $J"
run "sacct -j $J -p --format=JobID,State"
run "sacct -j $J -X -n -P --format=JobID,State"
run "sacct -j $A -P --format=JobID,JobIDRaw,State"
run "sacct -j 999999"
run "sacct -j 999999 -P -n; echo empty-ok"
run "sacct --bogus"

section "10. results of the long jobs of section 1 (partition bf)"
for _ in $(seq 300); do [[ -z "$(squeue -h -p bf -o %i)" ]] && break; sleep 1; done; sleep 2
show slurm-$T.out requeue-$RQ.out requeue-trunc-$RT.out
run "sacct -j $T,$RQ,$RT -P --format=JobID,JobName,State,ExitCode,Elapsed"
run "scontrol show job $RQ | grep -E 'Restarts|JobState'"

section "11. typed --gpus-per-task (22.05 binding bug), GPU env in steps, misc errors"
cat > typed.sh <<'EOF'
#!/bin/bash
#SBATCH -N 1 --ntasks=4 --gpus-per-task=l40s:1 -t 5 -J typed
echo "batch cvd=$CUDA_VISIBLE_DEVICES"
srun bash -c 'echo "procid=$SLURM_PROCID cvd=${CUDA_VISIBLE_DEVICES-unset} step_gpus=${SLURM_STEP_GPUS-unset} bind=${SLURMD_TRES_BIND-unset}"' | sort
unset CUDA_VISIBLE_DEVICES
srun bash -c 'echo "after unset: procid=$SLURM_PROCID cvd=${CUDA_VISIBLE_DEVICES-unset}"' | sort
EOF
cat > untyped.sh <<'EOF'
#!/bin/bash
#SBATCH -N 1 --ntasks=4 --gpus-per-task=1 -t 5 -J untyped
echo "batch cvd=$CUDA_VISIBLE_DEVICES"
srun bash -c 'echo "procid=$SLURM_PROCID cvd=${CUDA_VISIBLE_DEVICES-unset} step_gpus=${SLURM_STEP_GPUS-unset} bind=${SLURMD_TRES_BIND-unset}"' | sort
unset CUDA_VISIBLE_DEVICES
srun bash -c 'echo "after unset: procid=$SLURM_PROCID cvd=${CUDA_VISIBLE_DEVICES-unset}"' | sort
srun -n1 --gres=gpu:0 bash -c 'echo "gres=gpu:0 step: cvd=${CUDA_VISIBLE_DEVICES-unset}"'
EOF
cat > nogpu.sh <<'EOF'
#!/bin/bash
#SBATCH -N 1 -n 2 -t 5 -J nogpu
echo "batch cvd=${CUDA_VISIBLE_DEVICES-unset} job_gpus=${SLURM_JOB_GPUS-unset}"
srun bash -c 'echo "procid=$SLURM_PROCID cvd=${CUDA_VISIBLE_DEVICES-unset}"' | sort
EOF
for f in typed.sh untyped.sh nogpu.sh; do j=$(sbatch --parsable $f); waitjob $j; show slurm-$j.out; done
cat > steprun.sh <<'EOF'
#!/bin/bash
#SBATCH -N 2 -n 2 -t 5 -J showstep
srun -N2 sleep 6 &
sleep 2
scontrol show step $SLURM_JOB_ID.0
squeue -s -j $SLURM_JOB_ID
squeue -u $USER -h -o %i
wait
EOF
j=$(sbatch --parsable steprun.sh); waitjob $j; show slurm-$j.out
run "sinfo -p nosuch"
run "sinfo -N -p bf -o '%N %c %m %G %f %T'"
run "squeue -u nosuchuser"
run "scancel -t BOGUS"
run "sacct -S now-1hour -X -n -P --format=State | sort | uniq -c"

section "12. TMPDIR, SLURM_EXPORT_ENV, step SLURM_NNODES, background step when the batch script exits"
a=$(env -u TMPDIR sbatch --parsable -N2 --export=ALL,FOO=1 -t 5 --wrap 'echo "B: TMPDIR=${TMPDIR-unset} EXPORT=${SLURM_EXPORT_ENV-unset} NTASKS=${SLURM_NTASKS-unset} NNODES=$SLURM_NNODES"; srun -N1 -n1 bash -c "echo T: NNODES=\$SLURM_NNODES JOB_NUM_NODES=\$SLURM_JOB_NUM_NODES TMPDIR=\${TMPDIR-unset} NTASKS=\$SLURM_NTASKS"; srun -N2 sleep 100 & sleep 3; echo batch exits')
sleep 8; show slurm-$a.out
run "sacct -j $a -P --format=JobID,JobName,State,ExitCode"
