#!/usr/bin/env bash
# Training on a Cloud TPU pod slice (several TPU VMs, e.g. v5e 4x4 = 4 VMs of 4 chips): the
# same command on every VM at once. JAX detects the slice itself (process count, this VM's
# index, worker 0 as the coordinator): no coordinator flags are needed.
#
#   scripts/cluster/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [more flags of transformers_jax.train]
#   scripts/cluster/tpu_pod.sh my-v5e europe-west4-b experiments/gpt2.py:small \
#       /mnt/runs/gpt2_small --config.mesh.preset=fsdp
#
# A documented recipe, not tested in this repository's CI (which has no TPU pod); the
# multi-process behaviour it relies on is the one tests/test_slurm.py checks under SLURM.
# WORKDIR must be a folder every VM reaches (Filestore NFS, or a bucket mounted with gcsfuse at
# the same path on every VM). The code goes from this checkout to ~/transformers_jax on every VM.
#
# A maintenance event or a spot VM's preemption sends SIGTERM: every process saves the same
# step and exits 75, and the loop below starts the same command again, which resumes from
# WORKDIR. Exit code 0 ends the loop (done), anything else too (an error line says what).
# gcloud hands on the remote command's exit status (with --worker=all, a failing worker's);
# check the first stop by hand on your gcloud version before leaving the loop unattended.
set -uo pipefail
usage="usage: scripts/cluster/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [flags]"
name="${1:?$usage}" zone="${2:?$usage}" config="${3:?$usage}" workdir="${4:?$usage}"
shift 4
SAVED_AND_STOPPED=75
on_all() { gcloud compute tpus tpu-vm ssh "$name" --zone="$zone" --worker=all --command="$1"; }

# once: the code and an environment with JAX's TPU runtime on every VM
gcloud compute tpus tpu-vm scp --recurse --zone="$zone" --worker=all \
  pyproject.toml README.md transformers_jax experiments "$name":~/transformers_jax/ || exit
on_all "cd ~/transformers_jax && python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'" \
  || exit

flags="$(printf ' %q' "$@")"
while true; do
  on_all "cd ~/transformers_jax && .venv/bin/python -m transformers_jax.train \
    --config $config --workdir $workdir$flags"
  status=$?
  [[ $status -eq $SAVED_AND_STOPPED ]] || exit "$status"
  echo "stopped at a signal after saving: starting again to resume from $workdir"
  sleep 30  # (a VM under maintenance comes back; a preempted spot slice needs recreating)
done
