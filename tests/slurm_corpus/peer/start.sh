#!/usr/bin/env bash
# Start the corpus peer: the shared Slurm 22.05 peer's layout (private munged, slurmctld,
# 4 slurmd n1..n4 with 8 fake GPUs each) plus MariaDB + slurmdbd for accounting, with the
# site config in this directory. Everything at run time lives in $CORPUS_SLURM_RUN
# (default /tmp/corpus-slurm-run), outside the repository. Stop with ./stop.sh.
# SITE=A (default) or B picks the nodes' GPU types (nodes-*.conf.in); cases.json says which.
# Needs root and: apt-get install -y slurm-wlm munge slurmdbd mariadb-server
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUN="${CORPUS_SLURM_RUN:-/tmp/corpus-slurm-run}"
CTLD_PORT=26817 SLURMD_PORT0=27000 DBD_PORT=26819 DB_PORT=23306
log() { echo "[corpus-peer] $*"; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() { for _ in $(seq 100); do "$@" && return 0; sleep 0.2; done; return 1; }

mkdir -p "$RUN"/{etc,state,spool,log,pids,fakegpu,capture/env,mysql} "$RUN/munge/etc" "$RUN/munge/run"
chmod 755 "$RUN" "$RUN/munge" "$RUN/munge/run"; chmod 700 "$RUN/munge/etc"
chmod 1777 "$RUN/capture" "$RUN/capture/env"
render() { sed -e "s|@RUN@|$RUN|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$((SLURMD_PORT0+100))|g" \
  -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" \
  -e "s|@P1@|$((SLURMD_PORT0+1))|g" -e "s|@P2@|$((SLURMD_PORT0+2))|g" \
  -e "s|@P3@|$((SLURMD_PORT0+3))|g" -e "s|@P4@|$((SLURMD_PORT0+4))|g" "$1" > "$2"; }
render "$HERE/slurm.conf.in" "$RUN/etc/slurm.conf"
SITE="${SITE:-A}"
render "$HERE/nodes-$SITE.conf.in" "$RUN/etc/nodes.conf"
render "$HERE/gres-$SITE.conf.in" "$RUN/etc/gres.conf"
echo "$SITE" > "$RUN/site"
cp "$HERE/cgroup.conf" "$RUN/etc/cgroup.conf"
render "$HERE/slurmdbd.conf.in" "$RUN/etc/slurmdbd.conf"; chmod 600 "$RUN/etc/slurmdbd.conf"
render "$HERE/task_prolog.sh.in" "$RUN/etc/task_prolog.sh"; chmod 755 "$RUN/etc/task_prolog.sh"
render "$HERE/mailprog.sh.in" "$RUN/etc/mailprog.sh"; chmod 755 "$RUN/etc/mailprog.sh"
for i in $(seq 0 7); do f="$RUN/fakegpu/nvidia$i"; [[ -c "$f" ]] || { rm -f "$f"; mknod "$f" c 195 "$i"; }; done
export SLURM_CONF="$RUN/etc/slurm.conf"
echo "export SLURM_CONF=$RUN/etc/slurm.conf" > "$RUN/env.sh"

# munge
[[ -s "$RUN/munge/etc/munge.key" ]] || { mungekey -c -f -k "$RUN/munge/etc/munge.key"; chmod 400 "$RUN/munge/etc/munge.key"; }
alive "$RUN/munge/run/munged.pid" || munged --socket="$RUN/munge/run/munge.socket.2" \
  --key-file="$RUN/munge/etc/munge.key" --pid-file="$RUN/munge/run/munged.pid" \
  --log-file="$RUN/munge/munged.log" --seed-file="$RUN/munge/etc/munged.seed" --num-threads=2

# MariaDB (TCP on loopback only) for slurmdbd
DBSOCK="$RUN/mysql/mysqld.sock"
if [[ ! -d "$RUN/mysql/data/mysql" ]]; then
  mariadb-install-db --user=root --datadir="$RUN/mysql/data" > "$RUN/log/mariadb-install.log" 2>&1
fi
if ! alive "$RUN/pids/mariadb.pid"; then
  setsid mariadbd --user=root --datadir="$RUN/mysql/data" --bind-address=127.0.0.1 --port=$DB_PORT \
    --socket="$DBSOCK" --pid-file="$RUN/pids/mariadb.pid" --log-error="$RUN/log/mariadb.log" \
    --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 --skip-name-resolve </dev/null >/dev/null 2>&1 &
  wait_for test -S "$DBSOCK" || { echo "mariadb did not start" >&2; exit 1; }
  mariadb -S "$DBSOCK" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  log "mariadb up"
fi
alive "$RUN/pids/slurmdbd.pid" || { slurmdbd; sleep 2; }
wait_for sacctmgr -n list cluster >/dev/null 2>&1 || { echo "slurmdbd not answering" >&2; exit 1; }

# associations, QOS and accounts the corpus names (the site config a gq test gives too)
sam() { sacctmgr -i "$@" >/dev/null 2>&1 || true; }
sam add cluster gqpeer
for q in high debug_preempt turing regular; do sam add qos "$q"; done
for a in project_2001659 m3562_g vjgo8416-locomoset; do sam add account "$a" cluster=gqpeer; done
sam add user root account=root,project_2001659,m3562_g,vjgo8416-locomoset cluster=gqpeer
sam modify user root set qos=normal,high,debug_preempt,turing,regular defaultqos=normal

# KEEP_STATE=1 (switching SITE): job ids go on, so the accounting database keeps one record per id
alive "$RUN/pids/slurmctld.pid" || { [[ "${KEEP_STATE:-0}" == 1 ]] || rm -rf "$RUN/state"/*; slurmctld -f "$SLURM_CONF" -i; }
wait_for alive "$RUN/pids/slurmctld.pid"
for n in n1 n2 n3 n4; do mkdir -p "$RUN/spool/$n"; alive "$RUN/pids/slurmd-$n.pid" || slurmd -f "$SLURM_CONF" -N "$n"; done
for _ in $(seq 120); do
  idle="$(sinfo -h -t idle -p gpu -o '%D' 2>/dev/null | awk '{s+=$1} END{print s+0}')"
  [[ "$idle" == 4 ]] && break; sleep 0.5
done
sinfo -N -o '%N %P %T %G %f'
log "ready; source $RUN/env.sh"
