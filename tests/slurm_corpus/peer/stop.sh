#!/usr/bin/env bash
# Stop what start.sh started, by pid file only. CLEAN=1 also removes the runtime dir.
set -uo pipefail
RUN="${CORPUS_SLURM_RUN:-/tmp/corpus-slurm-run}"
export SLURM_CONF="$RUN/etc/slurm.conf"
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_pidfile() {
  alive "$2" || return 0
  local pid; pid="$(cat "$2")"; kill -TERM "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  echo "[corpus-peer] stopped $1 ($pid)"
}
if alive "$RUN/pids/slurmctld.pid"; then
  ids="$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
  [[ -n "${ids// }" ]] && scancel $ids 2>/dev/null && sleep 3
fi
for pf in "$RUN"/pids/slurmd-*.pid; do [[ -e "$pf" ]] && stop_pidfile "$(basename "$pf" .pid)" "$pf"; done
stop_pidfile slurmctld "$RUN/pids/slurmctld.pid"
stop_pidfile slurmdbd "$RUN/pids/slurmdbd.pid"
stop_pidfile mariadb "$RUN/pids/mariadb.pid"
stop_pidfile munged "$RUN/munge/run/munged.pid"
[[ "${CLEAN:-0}" == 1 ]] && rm -rf "$RUN" && echo "[corpus-peer] removed $RUN"
exit 0
