"""Training objectives as objects: which one a model trains with, and the registry.

lm              decoder-only          next-token prediction on text
mlm             encoder, head=mlm     masked LM (80/10/10 mask/random/keep)
classify_text   encoder, classifier   one label per text
classify_image  vit, classifier       one label per image
seq2seq         encoder_decoder       teacher forcing; greedy BLEU at evaluation
"""

from __future__ import annotations

from transformers_jax.tasks.base import Task, TaskData, cross_entropy
from transformers_jax.tasks.classify import ImageClassification, TextClassification
from transformers_jax.tasks.lm import LanguageModeling
from transformers_jax.tasks.mlm import MaskedLM
from transformers_jax.tasks.seq2seq import Translation

TASKS = {
    t.name: t
    for t in (
        LanguageModeling(),
        MaskedLM(),
        TextClassification(),
        ImageClassification(),
        Translation(),
    )
}


def task_for(model_cfg) -> Task:
  """The objective a model of this family and head trains with."""
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
    "task_for",
    "task_data",
    "LanguageModeling",
    "MaskedLM",
    "TextClassification",
    "ImageClassification",
    "Translation",
]
