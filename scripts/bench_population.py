"""8 models of the LR-sensitivity sweep as one population against the same 8 run one by one.

    python scripts/bench_population.py [--steps 1000] [--depth 2] \
        [--json experiments/results/benchmarks/population_cpu.json]

The 8 models are the sweep's (experiments/lr_sensitivity.py) pre-norm configuration at the
given depth: learning rates 1e-4, 3e-4, 1e-3, 3e-3 x warmup {0, 10% of steps}, seed 0. "one by
one" is 8 ordinary `train()` runs, each with its own compile, data loading, evaluations and
checkpoint, as a researcher sweeping them in a loop would get; "population" is one `train()`
of the population (one compile, vmapped step). Both write their run folders under a temporary
directory that is deleted afterwards; the token cache is made once before timing. Prints (and
with --json writes) wall and process CPU seconds of each side and the speedup, and the time from
start to the end of a 1-step run (setup, compile, the step, one evaluation, the save) of one solo
model and of the population, both after an untimed 1-step run has paid the process's one-time
costs; from those, the population's time after its first step and the wall speedup it would
have if its start took no longer than a solo run's.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys
import tempfile
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps

ROOT = pathlib.Path(__file__).resolve().parent.parent

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, json=output_paths.FILE)  # checked before any work
flags.DEFINE_integer("steps", 1000, "Training steps of every model.", flag_values=FLAGS)
flags.DEFINE_integer("depth", 2, "Blocks per model: 2 or 4 (the sweep's).", flag_values=FLAGS)
flags.DEFINE_string("json", "", "Also write the result to this file.", flag_values=FLAGS)
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3)


def _eval_loss(result: dict) -> float:
  """A solo run's final held-out loss, or a population's best member's."""
  if "members" in result:
    return min(m.get("eval_loss", float("inf")) for m in result["members"])
  return result.get("eval_loss", float("nan"))


def configs(steps: int, depth: int, cache: pathlib.Path):
  """(population config, [the 8 solo configs])."""
  sweep = sweeps.load_sweep(ROOT / "experiments" / "lr_sensitivity.py", ("BASE", "populations"))
  entry = next(e for e in sweep.populations() if e["name"] == f"pre-qkoff-L{depth}")  # noqa: E501
  warmups = (0, steps // 10)
  overrides = {
      **entry["overrides"],
      "steps": steps,
      "eval_every": max(steps // 10, 1),
      "population.seeds": 1,
      "population.learning_rates": repr(LEARNING_RATES),
      "population.warmup_steps": repr(warmups),
  }
  pop = sweeps.entry_config(
      sweep, {"name": entry["name"], "overrides": overrides}, cache, "population"
  )
  solos = []
  for lr in LEARNING_RATES:
    for warmup in warmups:
      solo = {
          k: v for k, v in overrides.items() if not k.startswith("population.")
      }  # an ordinary run
      solo.update({"learning_rate": lr, "warmup_steps": warmup})
      solos.append(
          sweeps.entry_config(sweep, {"name": "solo", "overrides": solo}, cache, "population")
      )
  return pop, solos


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if FLAGS.steps < 1 or FLAGS.depth not in (2, 4):
    raise UserError(
        f"--steps={FLAGS.steps} --depth={FLAGS.depth}: steps must be a positive integer and "
        "depth 2 or 4 (the depths of experiments/lr_sensitivity.py's populations)"
    )
  from absl import logging

  logging.set_verbosity(logging.WARNING)
  from transformers_jax.train.entry import train

  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    pop, solos = configs(FLAGS.steps, FLAGS.depth, tmp)
    from transformers_jax.tasks import task_data, task_for
    from transformers_jax.config import ModelConfig

    model_cfg = ModelConfig.from_dict(pop.model)
    task_data(task_for(model_cfg), pop, model_cfg, tmp / "warm")  # the token cache, untimed

    def timed(fn):
      wall, cpu = time.perf_counter(), time.process_time()
      out = fn()
      return out, time.perf_counter() - wall, time.process_time() - cpu

    # one line per run on stderr as each ends (stdout is the JSON); the time-left estimate
    # counts the full runs (the population about as much as one solo run), not the 1-step ones
    progress = sweeps.RowProgress([0, 0, 0] + [1] * len(solos) + [1])

    def quietly(run, name):  # the runs' own console lines, off the script's stdout
      progress.start(name)
      with contextlib.redirect_stdout(sys.stderr):
        out = run()
      progress.finish(name, "" if out is None else f"eval loss {_eval_loss(out):.4f}")
      return out

    def one_step(config, name):  # start to a finished first step (and its evaluation, save)
      config = config.copy_and_resolve_references()
      with config.unlocked():
        config.steps, config.eval_batches = 1, 1
      return timed(lambda: quietly(lambda: train(config, tmp / name), name))[1]

    # untimed: the process's one-time costs (imports, the first small compiles, the CPU peak
    # measurement behind a solo run's MFU) would otherwise land on whichever run comes first
    one_step(solos[0], "warm_up")
    solo_first = one_step(solos[0], "first_solo")
    pop_first = one_step(pop, "first_population")
    solo_results, solo_wall, solo_cpu = timed(
        lambda: [
            quietly(lambda c=c, i=i: train(c, tmp / f"solo_{i}"), f"solo_{i}")
            for i, c in enumerate(solos)
        ]
    )
    pop_result, pop_wall, pop_cpu = timed(
        lambda: quietly(lambda: train(pop, tmp / "population"), "population")
    )
  solo_loss = [r["eval_loss"] for r in solo_results]
  pop_loss = [m["eval_loss"] for m in pop_result["members"]]
  result = {
      "models": len(solos),
      "steps": FLAGS.steps,
      "depth": FLAGS.depth,
      "model": "experiments/lr_sensitivity.py pre-norm, d_model 32, batch 4 x 16 bytes",
      "one_by_one_wall_s": round(solo_wall, 1),
      "one_by_one_cpu_s": round(solo_cpu, 1),
      "population_wall_s": round(pop_wall, 1),
      "population_cpu_s": round(pop_cpu, 1),
      "speedup_wall": round(solo_wall / pop_wall, 2),
      "first_step_solo_s": round(solo_first, 1),
      "first_step_population_s": round(pop_first, 1),
      "first_step_ratio": round(pop_first / solo_first, 2),
      "speedup_cpu": round(solo_cpu / pop_cpu, 2),
      # the population's 999 further steps and its evaluations, and the wall speedup it would
      # have if its start (setup, compiles, first step) took no longer than a solo run's: what
      # removing every population-only start-up cost could give at most
      "population_after_first_step_s": round(pop_wall - pop_first, 1),
      "speedup_wall_if_started_as_fast_as_solo": round(
          solo_wall / (solo_first + pop_wall - pop_first), 2
      ),
      "max_final_eval_loss_difference": round(
          max(abs(a - b) for a, b in zip(solo_loss, pop_loss)), 6
      ),
  }
  print(json.dumps(result, indent=1))
  if FLAGS.json:
    path = pathlib.Path(FLAGS.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  cli.run_script(main)
