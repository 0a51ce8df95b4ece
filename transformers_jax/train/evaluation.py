"""Held-out evaluation, reduced the same way for a solo run and for each population member: the
Task's sums of every held-out batch added up (those named *_max: the largest kept), turned into
metrics by the Task (Task.eval_summary), the per-layer diagnostics of the first batch, and the
task's decoding metrics (e.g. BLEU)."""

from __future__ import annotations

import jax
import numpy as np

from transformers_jax.machine import parallel
from transformers_jax.tasks import Task
from transformers_jax.train.step import attention_logit_max, moe_dropped_fraction, residual_rms


def task_overrides(task, hook: str) -> bool:
  """Whether the task overrides a decoding hook of the base Task (eval_metrics, sample)."""
  return getattr(type(task), hook) is not getattr(Task, hook)


def add_sums(totals: dict | None, sums: dict) -> dict:
  """Sums of one more held-out batch added to `totals` (host arrays; those named *_max: the
  largest)."""
  if totals is None:
    return dict(sums)
  with np.errstate(over="ignore", invalid="ignore"):  # a diverged member's sums overflow: inf
    return {
        k: np.maximum(totals[k], sums[k]) if k.endswith("_max") else totals[k] + sums[k]
        for k in sums
    }


def summarize(task, data, totals: dict, intermediates, params=None, model_cfg=None) -> dict:
  """One model's held-out metrics from its summed `totals` and the `intermediates` sown on the
  first batch; with `params` (whole, on the host) also the task's decoding metrics."""
  out = task.eval_summary(data, totals)
  if params is not None and task_overrides(task, "eval_metrics"):
    out.update(task.eval_metrics(data, model_cfg, params))
  dropped = moe_dropped_fraction(intermediates)
  if dropped is not None:  # MoE: routing choices over expert capacity (first held-out batch)
    out["eval_moe_dropped_fraction"] = dropped
  out["residual_rms"] = residual_rms(intermediates)
  largest_attention = attention_logit_max(intermediates)
  if largest_attention:  # largest attention logit per block (first held-out batch)
    out["attention_logit_max"] = largest_attention
  return out


def evaluate_batches(eval_step, params, batches) -> tuple[dict, object]:
  """(summed sums, intermediates of the first batch) of `eval_step` over held-out `batches`,
  fetched to the host (on every process: all of them must call it; a population's members
  split over the data axis may live on other processes' devices)."""
  totals, first = None, None
  for batch in batches:
    sums, inter = eval_step(params, batch)
    totals = add_sums(totals, jax.device_get(parallel.gather_to_host(sums)))
    first = jax.device_get(parallel.gather_to_host(inter)) if first is None else first
  return totals, first
