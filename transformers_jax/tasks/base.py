"""What an objective is: a Task owns its batch layout, its forward pass and loss terms, whether
it models language, its data, and optional evaluation and sampling hooks.

The train loop, `--compile_only`, the benchmarks and the profiler ask a Task; none of them
branches on which objective it is. A new objective is one subclass (see tests/test_tasks.py).
Losses are sums over weighted positions, so micro-batches add up exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass
class TaskData:
  """A task's data for one run: batches are numpy dicts, a pure function of (seed, step).
  Each process feeds only some rows of a global batch: `train_rows` builds just those, else they
  are cut from `train_batch`."""

  train_batch: Callable[[int], dict]  # step -> global batch
  eval_batches: list  # fixed held-out batches
  tokenizer: Any = None  # a transformers_jax.data tokenizer, or None (images)
  summary: str = ""  # one line on what the data is, printed at start
  # (start, end) -> iterator of this process's rows of the batches of steps start..end-1, ahead
  # of the step (worker processes, prefetch); None = the loop calls train_batch
  train_stream: Callable[[int, int], Any] | None = None
  # UTF-8 bytes the weighted targets of eval_batches stand for (LMs): eval bits per byte
  eval_bytes: float | None = None
  # (step, first row, end row) -> those rows of the global batch, reading nothing else
  train_rows: Callable[[int, int, int], dict] | None = None
  # what identifies the content of a user's data (the token cache's key: files' sizes, times,
  # sampled content); a resume compares it with the run's (train/resume.py)
  source: str | None = None
  # held-out batches a task decodes at evaluation (seq2seq translations); None = its default
  decode_batches: list | None = None

  def rows(self, step: int, start: int, stop: int) -> dict:
    """Rows [start, stop) of the global batch of `step`."""
    if self.train_rows is not None:
      return self.train_rows(step, start, stop)
    return {k: v[start:stop] for k, v in self.train_batch(step).items()}


class Task:
  """Base class: subclasses set `name` and implement batch_shapes, outputs and data."""

  name = ""
  bundled_data = ""  # data.name of the data that needs no --config.data.path
  language_model = False  # reports perplexity (and decodes text)
  # masks and weights of a synthetic batch are ones; `synthetic_weight` of positions count
  synthetic_weight = 1.0

  def batch_shapes(self, model_cfg, config) -> dict[str, tuple[tuple[int, ...], Any]]:
    """{key: (shape, dtype)} of one global batch."""
    raise NotImplementedError

  def outputs(self, model, variables, batch, rngs, mutable):
    """Run `model` on `batch`: ((logits, targets, weights), mutated collections)."""
    raise NotImplementedError

  def data(self, config, model_cfg, workdir) -> TaskData:
    """Training and held-out batches for a run in `workdir` (tokenizers are saved there)."""
    raise NotImplementedError

  def tokens_per_example(self, model_cfg, config) -> int:
    """Tokens one example puts through the model (for throughput and FLOPs)."""
    return config.seq_len

  def eval_metrics(self, data: TaskData, model_cfg, params) -> dict:
    """Metrics beyond loss and accuracy at each evaluation (e.g. BLEU); none by default."""
    return {}

  def sample(self, data: TaskData, model_cfg, params, config) -> str | None:
    """What the model makes at the end of a run (text), or None."""
    return None

  def synthetic_batch(self, model_cfg, config, seed: int = 0) -> dict:
    """Random inputs of the shapes the train step takes, for benchmarks that time the step
    alone: ids within the vocabulary, labels within the classes, masks all ones."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, (shape, dtype) in self.batch_shapes(model_cfg, config).items():
      if key.endswith("mask") or key == "segment_ids":
        out[key] = np.ones(shape, dtype)
      elif key == "positions":
        out[key] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
      elif key == "weights":
        out[key] = (rng.random(shape) < self.synthetic_weight).astype(dtype)
      elif key == "labels" and len(shape) == 1:
        out[key] = rng.integers(0, model_cfg.num_classes, shape).astype(dtype)
      elif np.issubdtype(dtype, np.integer):
        out[key] = rng.integers(0, model_cfg.vocab_size, shape).astype(dtype)
      else:
        out[key] = rng.random(shape).astype(dtype)
    return out


def cross_entropy(
    logits,
    targets,
    weights,
    label_smoothing: float = 0.0,
    num_classes: int | None = None,
    z_loss=0.0,
) -> dict:
  """Sums over weighted positions: smoothed loss, plain nll, correct predictions, weight.

  The target's logit is taken with take_along_axis: a [..., 1] gather, which the SPMD
  partitioner runs shard-locally (masked, then summed over the shards) when the logits are split
  over the vocabulary (`tensor`), so they are never gathered whole. A one-hot product in its
  place costs a whole [..., V] temporary on XLA:CPU, which does not fuse it into the reduction.
  `num_classes`: the real classes when the last axis is padded (padded logits are masked by
  the model); label smoothing spreads over the real ones only. `z_loss` (a float, or a traced
  scalar) adds z_loss * log(Z)^2 per position, log(Z) being the log-partition function
  (log-sum-exp of the logits): it keeps the output logits from drifting (PaLM); "z_loss" in the
  sums is the weighted sum of log(Z)^2 either way.
  """
  logits = logits.astype(jnp.float32)
  n = logits.shape[-1]
  lse = jax.nn.logsumexp(logits, axis=-1)
  # mode="clip": a position weighted 0 may hold any id (padding, -1); clipped, its logit stays
  # finite where the default out-of-range fill (NaN) would make the weighted sum NaN.
  target_logit = jnp.take_along_axis(
      logits, targets[..., None].astype(jnp.int32), axis=-1, mode="clip"
  )
  nll = lse - target_logit[..., 0]
  loss = nll
  if label_smoothing:
    real = num_classes or n
    mean_logit = (
        jnp.sum(logits * (jnp.arange(n) < real), axis=-1) / real
        if real < n
        else jnp.mean(logits, axis=-1)
    )
    loss = (1.0 - label_smoothing) * nll - label_smoothing * (mean_logit - lse)
  w = weights.astype(jnp.float32)
  lse_squared = jnp.square(lse)
  if not (isinstance(z_loss, (int, float)) and z_loss == 0):
    loss = loss + z_loss * lse_squared
  # Correct where the target's logit is the largest, from values the loss already has: the max
  # (log-sum-exp's own) and the target's logit. jnp.argmax is a reduction of (value, index)
  # pairs that XLA:CPU runs unvectorised: 12% of a d256 step with a 32k vocabulary, where this
  # costs nothing. A target tied for the largest logit counts as predicted (argmax would take
  # the first of the tied ids); a row whose real logits are all equal (a zero-initialised head)
  # predicts nothing: its log-sum-exp exceeds its max by log(classes).
  largest = jnp.max(logits, axis=-1)
  uniform = lse - largest >= np.log(num_classes or n) - 1e-4
  correct = ((target_logit[..., 0] >= largest) & ~uniform).astype(jnp.float32)
  return {
      "loss": jnp.sum(loss * w),
      "nll": jnp.sum(nll * w),
      "correct": jnp.sum(correct * w),
      "weight": jnp.sum(w),
      "z_loss": jnp.sum(lse_squared * w),
  }
