"""lm-eval tasks on this project's models: the settings (config.eval_harness, or the evaluate
command's flags), one Harness per model shape and mesh, results written beside the run.

    harness = Harness(model_cfg, tokenizer, mesh, settings, rules)
    results = harness.evaluate(params)               # lm-eval's results dict
    write_results(workdir, step, results, member)    # WORKDIR/eval_harness/step_<S>[_member_<K>].json
    metrics(results)                                 # {"harness/<task>/<metric>": value}

Tasks are named as lm-eval names them; `include_path` adds a folder of task YAMLs (lm-eval's own
format: experiments/eval_tasks holds small local ones), searched first, so lm-eval's few
thousand built-in tasks are indexed only when a task is not found there. Nothing here downloads
anything: a task whose data is not on this machine fails as lm-eval fails.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib

from transformers_jax.errors import UserError
from transformers_jax.evaluate.scoring import Scorer
from transformers_jax import records

RESULTS_DIR = "eval_harness"


@dataclasses.dataclass(frozen=True)
class Settings:
  """What to run (config.eval_harness's fields, train_config.py says what each means)."""

  tasks: tuple[str, ...]
  include_path: str = ""
  limit: int = 0
  num_fewshot: int = -1
  batch_size: int = 16
  max_gen_toks: int = 256
  bootstrap_iters: int = 1000

  @classmethod
  def from_config(cls, group, **overrides) -> "Settings":
    """From config.eval_harness (a ConfigDict or dict), with `overrides` (None: not given)."""
    fields = {
        f.name: group.get(f.name, f.default) for f in dataclasses.fields(cls) if f.name in group
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    tasks = fields.pop("tasks", "")
    if isinstance(tasks, str):
      tasks = tuple(t.strip() for t in tasks.split(",") if t.strip())
    return cls(tasks=tuple(tasks), **fields)

  def problem(self) -> str | None:
    """What is wrong with these settings, as "<name>=<value>: why", or None."""
    for name, low, meaning in (
        ("batch_size", 1, "a positive number of sequences"),
        ("max_gen_toks", 1, "a positive number of tokens"),
        ("limit", 0, "a number of examples >= 0 (0: all)"),
        ("num_fewshot", -1, "a number of examples >= 0 (-1: each task's own)"),
        ("bootstrap_iters", 0, "a number of resamples >= 0 (0: no standard errors)"),
    ):
      if getattr(self, name) < low:
        return f"{name}={getattr(self, name)}: give {meaning}"
    return None


def require_lm_eval():
  """lm_eval, or one error line saying which extra installs it."""
  try:
    import lm_eval
  except ImportError:
    raise UserError(
        'the evaluation harness needs lm-eval, which is not installed: pip install -e ".[eval]"'
    ) from None
  return lm_eval


class _NoMetadataAdvice(logging.Filter):
  """Drops lm-eval's two-line warning, at the loading of every task with a custom_dataset (the
  local tasks' loader), that kwargs "can be passed to `--metadata`": advice about lm-eval's own
  command line, which this project's evaluate does not have."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "can be passed to `--metadata`" not in record.getMessage()


def quiet_lm_eval() -> None:
  """Installs _NoMetadataAdvice on lm-eval's task logger (once)."""
  task_logger = logging.getLogger("lm_eval.api.task")
  if not any(isinstance(f, _NoMetadataAdvice) for f in task_logger.filters):
    task_logger.addFilter(_NoMetadataAdvice())


def task_manager(include_path: str, tasks: tuple[str, ...]):
  """lm-eval's TaskManager over `include_path`, and over lm-eval's own tasks only when one of
  `tasks` is not among those found there (indexing them all takes seconds)."""
  from lm_eval.tasks import TaskManager

  if include_path:
    if not pathlib.Path(include_path).is_dir():
      raise UserError(f"eval_harness.include_path={include_path!r}: no such folder of task YAMLs")
    local = TaskManager(include_path=include_path, include_defaults=False)
    if all(t in local.all_tasks for t in tasks):
      return local
    # lm-eval skips a YAML it cannot parse, so its task would be "not found": say why instead
    broken = unparsed_yaml(include_path)
    if broken:
      missing = next(t for t in tasks if t not in local.all_tasks)
      raise UserError(
          f"lm-eval task {missing!r} not found: {broken}: fix that task YAML in " f"{include_path}"
      )
  manager = TaskManager(include_path=include_path or None)
  missing = [t for t in tasks if t not in manager.all_tasks]
  if missing:
    where = f" or in {include_path}" if include_path else ""
    raise UserError(
        f"lm-eval task {missing[0]!r} not found among lm-eval's tasks{where}: check the name "
        "(python -m lm_eval ls tasks lists them), or give the folder of its YAML with "
        "--config.eval_harness.include_path (evaluate: --include_path)"
    )
  return manager


def unparsed_yaml(folder: str) -> str | None:
  """The first YAML file under `folder` that is not valid YAML, as "FILE line L, column C does
  not parse (why)"; None when all parse. lm-eval's tags (`!function`) are read as nothing."""
  import yaml

  class Loader(yaml.SafeLoader):
    """YAML's safe loader that takes any `!tag`."""

  Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
  for path in sorted(pathlib.Path(folder).glob("**/*.yaml")):
    try:
      yaml.load(path.read_text(errors="replace"), Loader=Loader)
    except yaml.YAMLError as e:
      mark = getattr(e, "problem_mark", None)
      where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
      why = " ".join(str(getattr(e, "problem", None) or e).split())
      return f"{path}{where} does not parse ({why})"
  return None


class Harness:
  """lm-eval runs of one model shape on one mesh: `evaluate(params)` for each set of
  parameters (a run's, each population member's, each evaluation during training)."""

  def __init__(self, model_cfg, tokenizer, mesh, settings: Settings, rules=None):
    require_lm_eval()
    quiet_lm_eval()
    if tokenizer is None:
      raise UserError(
          "the run has no tokenizer.json, which lm-eval's text tasks need: evaluate a run "
          "trained on text (or convert one with its tokenizer)"
      )
    if not settings.tasks:
      raise UserError("no lm-eval tasks given: name them, e.g. --tasks pysyntax_choice")
    if settings.problem():
      raise UserError(f"eval_harness.{settings.problem()}")
    self.model_cfg, self.tokenizer, self.mesh = model_cfg, tokenizer, mesh
    self.settings, self.rules = settings, rules
    self.manager = task_manager(settings.include_path, settings.tasks)

  def evaluate(self, params) -> dict:
    """lm-eval's results of the settings' tasks for `params` (every process runs the same
    requests: the model's programs span them all)."""
    from lm_eval import evaluator

    from transformers_jax.evaluate.adapter import JaxLM

    # lm-eval would bootstrap standard errors in a pool of forked processes; forking a
    # process that runs JAX can deadlock, so its bootstrap runs in this process
    os.environ.setdefault("DISABLE_MULTIPROC", "1")
    s = self.settings
    scorer = Scorer(self.model_cfg, params, self.mesh, s.batch_size, self.rules)
    results = evaluator.simple_evaluate(
        model=JaxLM(scorer, self.tokenizer, s.max_gen_toks),
        tasks=list(s.tasks),
        num_fewshot=None if s.num_fewshot < 0 else s.num_fewshot,
        limit=s.limit or None,
        task_manager=self.manager,
        log_samples=False,
        bootstrap_iters=s.bootstrap_iters,
        batch_size=s.batch_size,
    )
    results.pop("samples", None)
    return results


def metrics(results: dict) -> dict[str, float]:
  """{"harness/<task>/<metric>": value} of lm-eval's results: each task's (and group's) numbers,
  a metric's filter after a slash unless it is lm-eval's "none"."""
  out = {}
  for task, values in {**results.get("results", {}), **results.get("groups", {})}.items():
    for key, value in values.items():
      if not isinstance(value, (int, float)) or isinstance(value, bool):
        continue  # the alias, and "N/A" standard errors
      name, _, filter_name = key.partition(",")
      suffix = "" if filter_name in ("", "none") else f"/{filter_name}"
      out[f"harness/{task}/{name}{suffix}"] = float(value)
  return out


def describe(scores: dict[str, float]) -> str:
  """The harness's scores in a few words: "pysyntax_choice acc 0.625, ..." (no stderrs)."""
  parts = [
      f"{name.split('/', 2)[1]} {name.split('/', 2)[2]} {value:.4g}"
      for name, value in scores.items()
      if "_stderr" not in name and not name.endswith("/sample_len")
  ]
  return ", ".join(parts) or "no scores"


def results_path(workdir, step: int, member: int | None = None) -> pathlib.Path:
  name = f"step_{step}" + ("" if member is None else f"_member_{member}")
  return pathlib.Path(workdir) / RESULTS_DIR / f"{name}.json"


def write_results(workdir, step: int, results: dict, member: int | None = None) -> pathlib.Path:
  """WORKDIR/eval_harness/step_<S>[_member_<K>].json: lm-eval's results (per task, n-shot,
  versions, task configs), with the step and member they belong to."""
  from lm_eval.utils import handle_non_serializable

  path = results_path(workdir, step, member)
  path.parent.mkdir(parents=True, exist_ok=True)
  record = {"step": step, "member": member, **results}
  text = json.dumps(record, indent=1, default=handle_non_serializable, sort_keys=True)
  records.write_text_atomically(path, text + "\n")
  return path


def due(config, done: int) -> bool:
  """Whether training runs the harness after step `done`: every eval_harness.every steps and at
  the run's last step."""
  every = config.get("eval_harness", {}).get("every", 0)
  return bool(every) and (done % every == 0 or done == config.steps)
