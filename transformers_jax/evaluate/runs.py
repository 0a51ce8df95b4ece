"""The harness on run folders: a finished run (the evaluate command) and a run in training
(train/loop.py, train/population.py call TrainingHarness after a step that config.eval_harness
asks for)."""

from __future__ import annotations

import sys

import jax

from transformers_jax.evaluate.harness import Harness, Settings, metrics, write_results
from transformers_jax.machine import parallel
from transformers_jax.modules.block import in_layout
from transformers_jax.run_folder.runs import Run


def run_mesh(config):
  """The run's mesh (config.json's mesh fields) on this host's devices, or every device along
  the data axis when they cannot make it (a run trained on a pod, scored on one host)."""
  try:
    return parallel.make_mesh(config.mesh.to_dict())
  except ValueError as e:
    print(
        f"note: the run's mesh does not fit these devices ({e}): using data={jax.device_count()}",
        file=sys.stderr,
    )
    return parallel.make_mesh({"data": -1})


def evaluate_run(workdir, overrides: dict, step: int | None = None, member: int | None = None):
  """Score run `workdir` (its latest checkpoint, or `step`) on lm-eval tasks: the run's
  config.eval_harness with `overrides` (None: not given). Every member of a population's run,
  or only `member` (refused for a single run). Writes WORKDIR/eval_harness/step_<S>[_member_<K>]
  .json; returns [(member or None, the file, lm-eval's results table)]."""
  run = Run(workdir)
  config, model_cfg = run.config(), run.model_config()
  settings = Settings.from_config(config.get("eval_harness", {}), **overrides)
  rules = parallel.rules(config.rules.to_dict())
  harness = Harness(model_cfg, run.tokenizer(), run_mesh(config), settings, rules)
  from lm_eval.utils import make_table  # (installed: Harness checked)

  tree, step = run.restore_tree(step)
  count = run.member_count(tree)
  chosen = [member] if member is not None or count is None else list(range(count))
  params = {k: in_layout(run.member_params(tree, k), model_cfg.scan_layers) for k in chosen}
  out = []
  for k in chosen:
    results = harness.evaluate(params[k])
    out.append((k, write_results(run.path, step, results, k), make_table(results)))
  return out


class TrainingHarness:
  """The harness of a run in training: built once (lm-eval's task index, the settings), run on
  each evaluation's parameters; process 0 writes the results files."""

  def __init__(self, setup, tokenizer, workdir):
    self.setup, self.workdir = setup, workdir
    settings = Settings.from_config(setup.config.eval_harness)
    self.harness = Harness(setup.model_cfg, tokenizer, setup.mesh, settings, setup.rule_table)

  def __call__(self, step: int, params, member: int | None = None) -> dict:
    """{"harness/<task>/<metric>": value} of `params` (on the run's mesh, or host arrays) after
    `step`; the results file written by process 0."""
    results = self.harness.evaluate(params)
    if jax.process_index() == 0:
      write_results(self.workdir, step, results, member)
    return metrics(results)
