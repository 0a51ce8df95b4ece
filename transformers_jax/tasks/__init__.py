"""Training objectives as objects: the registry, and which one a run trains with.

`--config.task=NAME` picks one by name (`--config_help` lists them with their summaries,
docs/architecture.md with the families they train); "" takes the model's own (task_for). A new
objective is its module and one line below (docs/objectives.md).
"""

from __future__ import annotations

import ml_collections

from transformers_jax.errors import UserError
from transformers_jax.tasks.base import Task, TaskData, cross_entropy
from transformers_jax.tasks.classify import ImageClassification, TextClassification
from transformers_jax.tasks.distill import Distillation
from transformers_jax.tasks.lm import LanguageModeling
from transformers_jax.tasks.mlm import MaskedLM
from transformers_jax.tasks.mtp import MultiTokenPrediction
from transformers_jax.tasks.prefix_lm import PrefixLM
from transformers_jax.tasks.seq2seq import Translation
from transformers_jax.tasks.sft import SupervisedFineTuning
from transformers_jax.tasks.span_corruption import SpanCorruption

# The registry: --config.task=NAME -> the objective. One line per objective.
TASKS = {
    t.name: t
    for t in (
        LanguageModeling(),
        MaskedLM(),
        TextClassification(),
        ImageClassification(),
        Translation(),
        SpanCorruption(),
        Distillation(),
        PrefixLM(),
        MultiTokenPrediction(),
        SupervisedFineTuning(),
    )
}


def model_task(model_cfg) -> Task:
  """The objective a model of this family and head trains with when config.task is empty."""
  family, head = model_cfg.family, model_cfg.head_kind
  if family == "decoder":
    return TASKS["lm"]
  if family == "encoder_decoder":
    return TASKS["seq2seq"]
  if family == "vit":
    if head != "classifier":
      raise ValueError("model.head: training a ViT needs head=classifier")
    return TASKS["classify_image"]
  if head == "mlm":
    return TASKS["mlm"]
  if head == "classifier":
    return TASKS["classify_text"]
  raise ValueError(
      "model.head=pooler has no training objective: use head=mlm (pre-training) "
      "or head=classifier (fine-tuning)"
  )


def task_for(model_cfg, config=None) -> Task:
  """The objective a run trains with: the registry's `config.task`, else the model's own."""
  name = str(config.get("task", "") or "") if config is not None else ""
  if not name:
    return model_task(model_cfg)
  if name not in TASKS:
    raise UserError(
        f"task={name!r}: no such objective; choose one of {', '.join(TASKS)} "
        "(--config_help describes them), or leave it empty for the model's own"
    )
  return TASKS[name]


def task_config_groups() -> ml_collections.ConfigDict:
  """{task name: its config fields} of every registered objective that has some: each
  experiment config holds them, so that --config.NAME.FIELD=... overrides them."""
  groups = ml_collections.ConfigDict()
  for name, task in TASKS.items():
    defaults = task.config_defaults()
    if defaults is not None:
      groups[name] = defaults
  return groups


def check_other_tasks_fields(config, task: Task) -> None:
  """Refuse a setting of another objective's own fields (`--config.distill.teacher=RUN` on a
  run that trains `lm`, say): that objective alone reads them, so this run would ignore it."""
  for name, other in TASKS.items():
    defaults = other.config_defaults()
    if name == task.name or defaults is None or name not in config:
      continue
    for field, default in defaults.items():
      value = config[name].get(field, default)
      if value != default:
        raise ValueError(
            f"{name}.{field}={value!r}: read only by --config.task={name}, and this run trains "
            f"{task.name}: add --config.task={name}, or leave {name}.{field} at {default!r}"
        )


def registry_lines() -> list[str]:
  """One line per registered objective: its name and what it trains (for --config_help)."""
  return [f"{name}: {task.summary}" for name, task in TASKS.items()]


def task_data(task: Task, config, model_cfg, workdir) -> TaskData:
  """The task's data for a run, after checking `data.name` names the task's bundled data."""
  import pathlib

  if config.data.name and config.data.name != task.bundled_data:
    raise ValueError(
        f"data.name={config.data.name!r}: the {task.name} objective's bundled data "
        f"is {task.bundled_data!r}; for other data set --config.data.path"
    )
  return task.data(config, model_cfg, pathlib.Path(workdir))


__all__ = [
    "Task",
    "TaskData",
    "TASKS",
    "cross_entropy",
    "model_task",
    "task_for",
    "task_config_groups",
    "check_other_tasks_fields",
    "registry_lines",
    "task_data",
    "LanguageModeling",
    "MaskedLM",
    "TextClassification",
    "ImageClassification",
    "Translation",
]
