#!/usr/bin/env bash
# Stops the one-node cluster of local_slurm_up.sh: cancels its jobs, ends slurmd and slurmctld
# (by their pid files), and munged if local_slurm_up.sh started it. Packages and the folder
# $LOCAL_SLURM_DIR (logs) stay. Safe to run when nothing is up.
set -uo pipefail

DIR="${LOCAL_SLURM_DIR:-/var/tmp/transformers_jax_slurm}"
[[ -f "$DIR/slurm.conf" ]] || exit 0
export SLURM_CONF="$DIR/slurm.conf"

scancel --full --quiet --partition=local 2>/dev/null || true
stop() {  # the process whose pid is in file $1, given up to 5 s to end
  local pid
  pid="$(cat "$1" 2>/dev/null)" || return 0
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}
stop "$DIR/slurmd.pid"
stop "$DIR/slurmctld.pid"
if [[ -f "$DIR/started_munged" ]]; then
  stop /run/munge/munged.pid
  rm -f "$DIR/started_munged"
fi
exit 0
