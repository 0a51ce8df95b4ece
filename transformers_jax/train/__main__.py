"""Train any family from a config:

    python -m transformers_jax.train --config experiments/gpt2.py:cpu --workdir runs/x \
        [--config.steps=2000 --config.model.norm_placement=post ...]

Running the same command again resumes from the latest checkpoint in --workdir. With
--compile_only it only compiles the step and reports per-device memory and FLOPs; --fit with it
searches the layout fields the command line leaves open until the step fits (train/fit.py).

Exit codes: 0 done; 2 an error, explained by one `error:` line; 3 --compile_only: the step does
not fit in device memory (--fit: no layout tried fits); 75 stopped by SIGTERM or Ctrl-C after
saving a checkpoint (run the same command again to resume; a batch script requeues on it:
scripts/cluster/train.sbatch); 130 a second Ctrl-C, nothing saved. Clusters (SLURM, TPU pods, GKE): docs/clusters.md.
"""

import sys

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

cli.define_config_flag()
flags.DEFINE_string(
    "workdir",
    None,
    "Directory for checkpoints, metrics and the run's config; the same command again resumes "
    "from it. SIGTERM (a cluster manager's notice) or Ctrl-C saves a checkpoint at the next "
    "step and exits with code 75 (not 2, an error; not 0, done), on which a batch script "
    "requeues the job.",
)
flags.DEFINE_bool(
    "compile_only",
    False,
    "Lower and compile the train step for the configured "
    "mesh, print per-device memory and FLOPs, and exit without training.",
)
flags.DEFINE_bool(
    "fit",
    False,
    "With --compile_only: keep every field set on the command line and search the others (remat "
    "policy, sharding rules, loss chunks, context strategy, host offload, gradient accumulation) "
    "with the compiler, from the least recomputation upward, until the step fits; prints the "
    "flags to paste. Exit 3 when nothing fits (docs/scaling.md).",
)
flags.DEFINE_float(
    "fit_memory_gib",
    None,
    "--fit: memory per device to fit in, GiB (default: the chip's HBM; needed on a CPU).",
)
flags.DEFINE_string(
    "fit_cache",
    None,
    "--fit: JSON file of compile reports keyed by configuration (default: fit.json beside the "
    "compile cache, ~/.cache/transformers_jax; 'off' = none); the same search again compiles "
    "nothing.",
)
flags.DEFINE_integer(
    "fit_max_compiles", 14, "--fit: most layouts one search compiles (cached ones are free)."
)
flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0 for multi-process runs; "
    "without it JAX detects a cluster (TPU, SLURM …) or runs one process.",
)
flags.DEFINE_integer(
    "coordinator_port",
    None,
    "TCP port of the coordinator (process 0), keeping the address's host: under a cluster "
    "manager (SLURM, a TPU pod, Kubernetes), where JAX detects the host and picks a port "
    "itself (SLURM: 61440 + job id % 4096), or with --coordinator_address. The environment "
    "variable JAX_COORDINATOR_PORT does the same. A port another program holds stops every "
    "process within seconds with one line naming it.",
)
flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index (with --coordinator_address).")
flags.DEFINE_integer(
    "join_timeout_s",
    300,
    "Seconds to wait for every process of a multi-process run to join before stopping with an "
    "error.",
)
flags.DEFINE_string(
    "compile_cache_dir",
    "",
    "Folder of JAX's persistent compilation cache ('' = $JAX_COMPILATION_CACHE_DIR, else "
    "~/.cache/transformers_jax/jax; 'off' = none): a rerun or resume does not recompile.",
)
flags.DEFINE_bool(
    "allow_data_change",
    False,
    "Resume even though seed or data.* differ from the run's: the batches after the "
    "checkpoint then come from another stream than the run's first part.",
)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}: pass options as --flag=value")
  if FLAGS.config is None:
    raise UserError("--config is required, e.g. --config experiments/gpt2.py:cpu")
  check_fit_flags()
  from transformers_jax.machine import cluster_join, compile_cache

  # A step compiled for a TPU topology has no devices here to load into, so JAX cannot read it
  # back from the cache (it warns on every rerun): such compiles leave the cache alone.
  topology_only = FLAGS.compile_only and FLAGS.config.mesh.topology
  compile_cache.enable(compile_cache.OFF if topology_only else FLAGS.compile_cache_dir)
  cluster_join.initialize_distributed(
      FLAGS.coordinator_address,
      FLAGS.num_processes,
      FLAGS.process_id,
      FLAGS.join_timeout_s,
      coordinator_port=FLAGS.coordinator_port,
  )
  if FLAGS.compile_only and FLAGS.fit:
    fit_main()
    return
  if FLAGS.compile_only:
    import jax

    from transformers_jax.train import compile as compile_step
    from transformers_jax.train import fit

    try:
      # every process compiles (the program spans them all); process 0 alone prints it
      result = compile_step.report(FLAGS.config, verbose=jax.process_index() == 0)
    except compile_step.OutOfMemory as refused:  # the compiler refused it
      result = refused.report
    if result.get("fits") is False:  # refused, or compiled with a peak over the chip's HBM
      knobs = fit.hints(FLAGS.config, compile_step.devices_for(FLAGS.config))
      print(
          "error: the step does not fit in device memory: run again with --fit to search the "
          "layouts"
          + (f", or set by hand {'; '.join(knobs)}" if knobs else "")
          + "; else shard more (a larger --config.mesh.fsdp, --config.mesh.context for long "
          "sequences, or --config.mesh.tensor for heads and d_ff) or lower --config.batch_size",
          file=sys.stderr,
      )
      sys.exit(3)
    return
  if FLAGS.config.mesh.topology:
    raise UserError(
        f"mesh.topology={FLAGS.config.mesh.topology!r} only describes hardware "
        "to compile for: use it with --compile_only, or set it to '' to train"
    )
  if not FLAGS.workdir:
    raise UserError("--workdir is required: where the run's files go (e.g. runs/x)")
  from transformers_jax.train.entry import train

  train(FLAGS.config, FLAGS.workdir, allow_data_change=FLAGS.allow_data_change)


FIT_FLAGS = ("fit_memory_gib", "fit_cache", "fit_max_compiles")


def check_fit_flags() -> None:
  """--fit compiles candidates: it needs --compile_only, one model, and sensible limits."""
  from transformers_jax.train import members

  given = [f for f in FIT_FLAGS if FLAGS[f].present]
  if given and not FLAGS.fit:
    raise UserError(f"--{given[0]} is read by --fit only: add --fit --compile_only, or drop it")
  if not FLAGS.fit:
    return
  if not FLAGS.compile_only:
    raise UserError(
        "--fit searches layouts by compiling the step, not training: add --compile_only (and "
        "--config.mesh.topology=... to compile for a TPU slice), then train with the flags it "
        "prints"
    )
  if members.enabled(FLAGS.config):
    raise UserError(
        "--fit searches the layout of one model's step, and the config asks for a population "
        "(population.*): fit one member (leave the population lists empty and seeds 0), then "
        "give the population that layout"
    )
  if FLAGS.fit_memory_gib is not None and not FLAGS.fit_memory_gib > 0:
    raise UserError(f"--fit_memory_gib={FLAGS.fit_memory_gib}: give a positive size, e.g. 16")
  if FLAGS.fit_max_compiles < 1:
    raise UserError(f"--fit_max_compiles={FLAGS.fit_max_compiles}: give at least 1, e.g. 14")


def fit_main() -> None:
  """--compile_only --fit: the search (train/fit.py), its progress one line per layout on
  stderr, the command line to paste, and the fitting layout's compile report on stdout."""
  import json
  import shlex

  from transformers_jax.train import fit

  user_fields = set(FLAGS["config"].override_values)
  try:
    result = fit.search(
        FLAGS.config,
        user_fields,
        memory_gib=FLAGS.fit_memory_gib,
        cache_path=FLAGS.fit_cache,
        max_compiles=FLAGS.fit_max_compiles,
    )
  except fit.NoFit as none:
    print(json.dumps(none.report, indent=1, default=str))
    print(f"error: {none}", file=sys.stderr)
    sys.exit(3)
  fit_args = ("--fit", "--fit_memory_gib", "--fit_cache", "--fit_max_compiles")
  kept, args = [], iter(sys.argv[1:])
  for arg in args:
    if arg.split("=")[0] not in fit_args:
      kept.append(arg)
    elif "=" not in arg and arg != "--fit":  # "--fit_cache PATH": its value goes too
      next(args, None)
  command = shlex.join(["python", "-m", "transformers_jax.train", *kept])
  if result["fit"]["flags"]:
    command += " " + result["fit"]["flags"]
  result["fit"]["command"] = command
  print(f"fits: {command}", file=sys.stderr)
  print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
  cli.run(main, start_backends=False)
