"""Compile one population of a sweep file and time its train step: what a sweep's step costs.

    python scripts/population_step_time.py --sweep experiments/deep_postnorm_translation.py \
        --population post-L12+12 [--steps 10] [--set data.source_len=48 --set ...] \
        [--trace DIR] [--json FILE]

The population is the sweep's entry of that name (scripts/lr_sensitivity.py's config), with
every --set key=value applied on top (a config field, its value as Python: 48, True, 'pre').
The step is compiled once, run once untimed, then --steps times on the first training batch of
the first seed, stacked for every member. Prints one JSON line: members, compile seconds, the
compiler's FLOPs and bytes accessed per step (a scanned stack counts its block once), and wall
and process CPU seconds per step. --trace DIR also writes a profile of 3 steps there (a
perfetto trace, one event per executed operation).
"""

from __future__ import annotations

import ast
import json
import pathlib
import tempfile
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(
    FLAGS, trace=output_paths.FOLDER, json=output_paths.FILE
)  # checked before any work
flags.DEFINE_string(
    "sweep", None, "Sweep file, e.g. experiments/deep_postnorm.py.", flag_values=FLAGS
)
flags.DEFINE_string("population", None, "The entry's name, e.g. post-L12.", flag_values=FLAGS)
flags.DEFINE_integer("steps", 10, "Timed steps.", flag_values=FLAGS)
flags.DEFINE_multi_string("set", [], "key=value config override (repeatable).", flag_values=FLAGS)
flags.DEFINE_string("trace", "", "Write a profile of 3 steps to this folder.", flag_values=FLAGS)
flags.DEFINE_string("json", "", "Also append the JSON line to this file.", flag_values=FLAGS)


def overrides(pairs: list[str]) -> dict:
  out = {}
  for pair in pairs:
    key, sep, text = pair.partition("=")
    if not sep or not key:
      raise UserError(f"--set {pair!r}: give key=value, e.g. --set data.source_len=8")
    try:
      out[key] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      out[key] = text  # a bare string
  return out


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.sweep or not FLAGS.population or FLAGS.steps < 1:
    raise UserError(
        "--sweep and --population are required and --steps must be >= 1, e.g. --sweep "
        "experiments/deep_postnorm_translation.py --population post-L12+12"
    )
  import jax
  import numpy as np

  from transformers_jax.train.setup import Setup

  sweep = sweeps.load_sweep(FLAGS.sweep, ("BASE", "populations"))
  entries = {e["name"]: e for e in sweep.populations(False)}
  if FLAGS.population not in entries:
    raise UserError(
        f"--population {FLAGS.population}: not in {FLAGS.sweep}; its populations are "
        + ", ".join(entries)
    )
  entry = entries[FLAGS.population]
  entry = {**entry, "overrides": {**entry["overrides"], **overrides(FLAGS.set)}}
  with tempfile.TemporaryDirectory() as tmp:
    config = sweeps.entry_config(sweep, entry, pathlib.Path(tmp))
    setup = Setup(config)
    state = setup.init_state()
    data = setup.data(pathlib.Path(tmp) / "run", config.seed)
    first = next(data.train_stream(0, 1)) if data.train_stream else data.train_batch(0)
    count = setup.member_count
    batch = jax.device_put({k: np.stack([first[k]] * count) for k in first}, setup.batch_sharding())
    start = time.perf_counter()
    step = setup.train_step().lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    cost = step.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(FLAGS.steps):
      state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if FLAGS.trace:
      jax.profiler.start_trace(FLAGS.trace, create_perfetto_trace=True)
      for _ in range(3):
        state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      jax.profiler.stop_trace()
  row = {
      "sweep": FLAGS.sweep,
      "population": FLAGS.population,
      "set": overrides(FLAGS.set),
      "members": count,
      "compile_s": round(compile_s, 1),
      "gflops_per_step": round(cost.get("flops", 0.0) / 1e9, 3),
      "gbytes_per_step": round(cost.get("bytes accessed", 0.0) / 1e9, 3),
      "wall_s_per_step": round(wall / FLAGS.steps, 4),
      "cpu_s_per_step": round(cpu / FLAGS.steps, 4),
  }
  print(json.dumps(row), flush=True)
  if FLAGS.json:
    with open(FLAGS.json, "a") as f:
      f.write(json.dumps(row) + "\n")
  return 0


if __name__ == "__main__":
  cli.run_script(main)
