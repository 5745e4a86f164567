#!/usr/bin/env bash
# A real one-node Slurm on this machine, for the `slurm` tests (needs root and apt).
#
#   .ci/slurm_node.sh start   install slurm-wlm, munge, slurmdbd and mariadb if missing,
#                             write the configs for this host (its CPUs and memory, two
#                             fake GPUs as a GRES), start the daemons, wait for an idle node
#   .ci/slurm_node.sh stop    stop the daemons this script started, by pid
#
# Accounting (slurmdbd on mariadb) is on so `sacct` answers; the profile asks the
# executor plugin to poll `squeue` instead (see profiles/slurm/profile.yaml), and
# MinJobAge keeps finished jobs in squeue long enough for that.
set -euo pipefail

STATE=${DRAFTSMITH_SLURM_STATE:-/tmp/draftsmith-slurm}
CLUSTER=draftsmith
HOST=$(hostname -s)

log() { echo "slurm_node: $*" >&2; }

running() {  # running PIDFILE: its process is alive
  local pid
  pid=$(cat "$1" 2>/dev/null) && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

install() {
  local missing=()
  for tool in slurmctld slurmd slurmdbd munged mariadbd; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if ((${#missing[@]})); then
    log "installing slurm-wlm munge slurmdbd mariadb-server (missing: ${missing[*]})"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge slurmdbd mariadb-server >/dev/null
  fi
}

write_configs() {
  local cpus memory
  cpus=$(nproc)
  # RealMemory above what slurmd measures makes the node INVAL: keep a margin.
  memory=$(( $(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') * 9 / 10 ))
  mkdir -p /etc/slurm "$STATE"/{spool,state,log,db}
  for n in 0 1; do
    [[ -e /dev/fakegpu$n ]] || mknod "/dev/fakegpu$n" c 1 3  # Slurm 22.05 wants a device file per GPU
  done
  cat >/etc/slurm/slurm.conf <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( memory / cpus / 2 ))
GresTypes=gpu
MinJobAge=600
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/none
AccountingStorageTRES=gres/gpu
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory Gres=gpu:2 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  echo "Name=gpu File=/dev/fakegpu[0-1]" >/etc/slurm/gres.conf
  cat >/etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "timed out waiting for $what"; exit 1; }
    sleep 1
  done
}

start() {
  install
  write_configs
  [[ -f /etc/munge/munge.key ]] || mungekey --create
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  if ! running "$STATE/munged.pid"; then
    munged --force --pid-file="$STATE/munged.pid"  # as root: it writes its pid file in $STATE
  fi
  if [[ ! -d $STATE/db/mysql ]]; then
    mariadb-install-db --user=root --datadir="$STATE/db" >/dev/null
  fi
  mariadbd --user=root --datadir="$STATE/db" --bind-address=127.0.0.1 --port=3306 \
    --socket="$STATE/mysqld.sock" --pid-file="$STATE/mariadbd.pid" >"$STATE/log/mariadbd.log" 2>&1 &
  wait_for 60 mariadb mariadb --socket="$STATE/mysqld.sock" -e "select 1"
  mariadb --socket="$STATE/mysqld.sock" -e "
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  slurmdbd
  wait_for 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
  slurmctld
  slurmd
  wait_for 90 "an idle node" sh -c "sinfo -h -N -o %T | grep -qx idle"
  log "node $HOST idle: $(sinfo -h -N -o '%c CPUs, %m MB, %G')"
}

stop() {
  for daemon in slurmd slurmctld slurmdbd mariadbd munged; do
    local pidfile=$STATE/$daemon.pid pid
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if running "$pidfile"; then
      kill "$pid"
      log "stopped $daemon (pid $pid)"
    fi
    rm -f "$pidfile"
  done
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
