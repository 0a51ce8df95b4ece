#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (munge, slurmctld and slurmd on localhost), for
# trying the batch scripts in this folder and for the tests in tests/test_slurm.py.
#
#   sudo scripts/cluster/local_slurm_up.sh     # prints: export SLURM_CONF=...
#   sudo scripts/cluster/local_slurm_down.sh   # stops what this started
#
# Idempotent: installs Debian's slurm-wlm and munge only when they are missing, starts only the
# daemons that are not answering, and returns at once when the cluster is up. Needs root and
# apt-get (Debian, Ubuntu); elsewhere it changes nothing, prints one line saying why and exits
# 77. No systemd or cgroups: processes are tracked through /proc (proctrack/linuxproc), tasks
# are not bound to cores (task/none), and there is no accounting.
#
# Everything it writes goes under $LOCAL_SLURM_DIR (default /var/tmp/transformers_jax_slurm):
# slurm.conf, state, spool, logs and pid files; /etc/slurm is left alone. Commands find the
# cluster through SLURM_CONF=$LOCAL_SLURM_DIR/slurm.conf. The cluster's one node, `localhost`,
# offers $LOCAL_SLURM_CPUS CPUs (default 8, whatever the machine has: enough for several
# one-CPU tasks side by side) in one partition, `local`.
set -euo pipefail

DIR="${LOCAL_SLURM_DIR:-/var/tmp/transformers_jax_slurm}"
CPUS="${LOCAL_SLURM_CPUS:-8}"
CONF="$DIR/slurm.conf"
CANNOT=77  # the exit code for "this machine cannot host the cluster"

cannot() {
  echo "local SLURM cluster not started: $1" >&2
  exit "$CANNOT"
}

[[ "$(uname -s)" == Linux ]] || cannot "needs Linux"
[[ "$(id -u)" == 0 ]] || cannot "needs root (it installs packages and starts daemons): run it with sudo"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
  || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || cannot "slurm-wlm and munge are not installed and there is no apt-get to install them"
  echo "installing slurm-wlm and munge ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get install -y -q --no-install-recommends slurm-wlm munge >"$DIR.apt.log" 2>&1; }
  mkdir -p "$(dirname "$DIR")"
  apt_install || { apt-get update -q >>"$DIR.apt.log" 2>&1 && apt_install; } \
    || cannot "apt-get install slurm-wlm munge failed (see $DIR.apt.log)"
fi

mkdir -p "$DIR/state" "$DIR/spool"

# munge: the key the package made, a socket folder owned by its user, the daemon as that user
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  [[ -s /etc/munge/munge.key ]] || {
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key; \
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  }
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 755 /run/munge
  runuser -u munge -- munged --force
  touch "$DIR/started_munged"  # local_slurm_down.sh stops munged only if this started it
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || cannot "munged did not start (see /var/log/munge/munged.log)"
fi

cat >"$CONF.new" <<EOF
# written by scripts/cluster/local_slurm_up.sh: one node, localhost
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# job credentials live 10 s (default 120): a requeued job may start again 10 s after it stopped
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# try pending jobs every 2 s (default 60), so that a requeued job starts when it may
SchedulerParameters=sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
# seconds between a cancelled job's SIGTERM and its SIGKILL (a run saves within a few)
KillWait=20
NodeName=localhost CPUs=$CPUS State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$CONF"

up() { scontrol ping 2>/dev/null | grep -q "is UP" && sinfo -h -n localhost -o %t 2>/dev/null | grep -Eq "^(idle|mix|alloc)"; }

if ! cmp -s "$CONF.new" "$CONF" || ! up; then
  mv "$CONF.new" "$CONF"
  # (re)start whichever daemon is not running with this configuration
  for daemon in slurmctld slurmd; do
    pidfile="$DIR/$daemon.pid"
    if [[ -s "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      kill "$(cat "$pidfile")" && sleep 1
    fi
  done
  slurmctld -i -f "$CONF"
  slurmd -N localhost -f "$CONF"
  for _ in $(seq 100); do up && break; sleep 0.2; done
  if ! up; then
    scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
    sleep 1
  fi
  up || cannot "slurmctld or slurmd did not come up (see $DIR/slurmctld.log and $DIR/slurmd.log)"
else
  rm -f "$CONF.new"
fi
echo "export SLURM_CONF=$CONF"
