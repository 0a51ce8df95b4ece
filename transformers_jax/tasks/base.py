"""What an objective is: a Task owns its batch layout, its forward pass, its loss and the
metrics it reports, the checks of the settings it reads, its data, its own config fields, and
optional evaluation and sampling hooks.

The train loop, `--compile_only`, the benchmarks and the profiler ask a Task; none of them
branches on which objective it is. A new objective is one subclass registered in
tasks/__init__.py (docs/objectives.md walks through one). Losses are sums over weighted
positions, so micro-batches, devices and held-out batches add up exactly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformers_jax.models.common import output_logits


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
  # a mixture's sources (data.mixture): their names, in the order of the one-hot `source` [B,
  # sources] its held-out batches carry (the evaluation reports each source's loss), and the
  # UTF-8 bytes of each source's held-out targets (bits per byte), or None
  source_names: list[str] | None = None
  source_eval_bytes: list[float] | None = None
  # step -> metrics of the data itself at a logged step (a mixture's tokens seen per source)
  step_metrics: Callable[[int], dict] | None = None

  def rows(self, step: int, start: int, stop: int) -> dict:
    """Rows [start, stop) of the global batch of `step`."""
    if self.train_rows is not None:
      return self.train_rows(step, start, stop)
    return {k: v[start:stop] for k, v in self.train_batch(step).items()}


class Task:
  """Base class: subclasses set `name` and implement batch_shapes, outputs and data; the loss,
  metrics and checks default to today's cross-entropy objectives'."""

  name = ""
  summary = ""  # one line on what it trains (--config_help lists the registry with it)
  families: tuple[str, ...] = ()  # the model families it trains (empty: any)
  # model fields without which it has nothing to train (the registry's tests build with them)
  model_needs: dict = {}
  heads: tuple[str, ...] = ()  # and the heads they need (empty: any)
  bundled_data = ""  # data.name of the data that needs no --config.data.path
  language_model = False  # reports perplexity (and decodes text)
  # masks and weights of a synthetic batch are ones; `synthetic_weight` of positions count
  synthetic_weight = 1.0
  # the model attends causally: a sequence split over mesh.context is cut into zig-zag chunks
  causal = False
  # what data.packing packs into rows: "documents" of --config.data.path, whole "examples", or
  # "" (packing refused)
  packs = ""
  reads_seq_len = True  # the batch's length is seq_len (not, e.g., an image's patches)
  # training fields beyond the common ones that this objective reads ("data.source_len", ...)
  reads_fields: tuple[str, ...] = ()
  # `loss` can take the logits a chunk of tokens at a time (config.loss_chunks): `outputs`
  # then also returns (hidden states, unembedding matrix) after (logits, targets, weights)
  chunked_loss = False

  def attends_causally(self, model_cfg) -> bool:
    """Whether `model_cfg`'s attention is causal under this objective (`causal`; an objective
    that trains more than one family answers per model)."""
    return self.causal

  def config_defaults(self):
    """The objective's own config fields, an ml_collections.ConfigDict every experiment config
    holds as `config.<name>` (`--config.<name>.FIELD=...`; documented by the comments beside
    the fields, as train_config.py's are); None = no fields of its own."""
    return None

  def check(self, config, model_cfg) -> None:
    """Refuse settings that mean nothing for this objective: a ValueError naming the field and
    the fix, before any data is read or anything compiles."""
    packing = config.data.packing
    family, head = model_cfg.family, model_cfg.head_kind
    if (self.families and family not in self.families) or (self.heads and head not in self.heads):
      wants = " or ".join(self.families) + (
          f" (head {' or '.join(self.heads)})" if self.heads else ""
      )
      raise ValueError(
          f"task={self.name!r}: trains {wants} models and this is a {family} model with head "
          f"{head}: use such a model's --config, or leave task empty for this model's own"
      )

    chunks = config.get("loss_chunks", 1)
    if chunks != 1 and (not self.chunked_loss or chunks < 1 or config.seq_len % chunks):
      fix = (
          f"a divisor of seq_len={config.seq_len}, e.g. {max(1, config.seq_len // 512)}"
          if self.chunked_loss
          else f"the {self.name} objective computes its logits whole: leave it at 1"
      )
      raise ValueError(f"loss_chunks={chunks!r}: {fix}")

    def fail(field, problem):
      value = config.data[field.split(".", 1)[1]]
      raise ValueError(f"{field}={value!r}: {problem}")

    mixture = config.data.get("mixture", "")
    if packing and self.packs == "documents" and not (config.data.path or mixture):
      fail("data.packing", "packs the documents of --config.data.path; set one or turn it off")
    if mixture and self.packs != "documents":  # the objectives that stream a user's text
      fail(
          "data.mixture",
          f"mixes text sources for the objectives that read text documents (lm, mlm, "
          f"span_corruption, distill), and this run trains {self.name}: use --config.data.path",
      )
    if packing and not self.packs:
      fail(
          "data.packing",
          "packs text: documents for language models, examples for text classification and "
          "seq2seq (not images); turn it off",
      )
    if packing and self.packs == "examples":
      if config.data.examples_per_row < 1:
        fail("data.examples_per_row", "packed rows hold at least 1 example")
      most = max(1, config.seq_len // 2)  # an example takes 2 tokens at least
      if config.data.examples_per_row > most:
        fail(
            "data.examples_per_row",
            f"a row of seq_len={config.seq_len} tokens holds at most {most} examples of 2 "
            f"tokens or more: set it between 1 and {most}",
        )

  def loss_options(self, config):
    """What `loss` reads of the run's config while training (a pytree of Python values),
    resolved once when the step is built: by default the label smoothing."""
    options = {"label_smoothing": config.label_smoothing}
    if config.get("loss_chunks", 1) > 1:
      options["loss_chunks"] = config.loss_chunks
    return options

  def loss(self, outputs, batch, model_cfg, options, z_loss=0.0, train=True) -> dict:
    """Sums over the batch's weighted positions from `outputs` (what `outputs` returned):
    "loss" (the objective minimised) and "weight" (what it is divided by), and any others the
    objective reports; sums named *_max are reduced by their maximum over held-out batches.
    The default: cross-entropy of (logits, targets, weights), with `options` (loss_options; a
    bare number: the label smoothing) and the z-loss weight `z_loss` (a float, or a population
    member's traced scalar) while training, the output logits' mean and largest value at
    evaluation (train=False, options None)."""
    logits, targets, weights, *unembedded = outputs
    smoothing = (
        options
        if isinstance(options, (int, float))
        else (options or {}).get("label_smoothing", 0.0)
    )
    padded = logits.shape[-1] == model_cfg.padded_vocab != model_cfg.vocab_size
    real = model_cfg.vocab_size if padded else None  # the real classes of a padded vocabulary
    if not train:  # a mixture's held-out rows name their source: sums per source too
      sums = cross_entropy(logits, targets, weights, num_classes=real, groups=batch.get("source"))
      vocab = logits[..., : model_cfg.vocab_size].astype(jnp.float32)
      sums["logit_sum"] = jnp.sum(jnp.mean(vocab, axis=-1) * weights.astype(jnp.float32))
      sums["logit_max"] = jnp.max(vocab)
      return sums
    chunks = options.get("loss_chunks", 1) if isinstance(options, dict) else 1
    if chunks > 1 and unembedded:  # the logits above are then never computed (XLA drops them)
      hidden, matrix = unembedded[0]
      sums = chunked_cross_entropy(
          hidden, matrix, model_cfg, targets, weights, chunks, smoothing, real, z_loss
      )
    else:
      sums = cross_entropy(logits, targets, weights, smoothing, real, z_loss)
    if isinstance(z_loss, (int, float)) and z_loss == 0:
      del sums["z_loss"]  # reported only where it is weighted
    return sums

  def metrics(self, sums, weight) -> dict:
    """A training step's metrics from its summed `sums` (`weight`: sums["weight"], at least 1)."""
    out = {
        "loss": sums["loss"] / weight,
        "nll": sums["nll"] / weight,
        "accuracy": sums["correct"] / weight,
    }
    if "z_loss" in sums:
      out["log_z_squared"] = sums["z_loss"] / weight
    return out

  def eval_summary(self, data: TaskData, totals: dict) -> dict:
    """Held-out metrics from the `totals` of `loss(..., train=False)` over every held-out
    batch (host numbers)."""
    w = max(float(totals["weight"]), 1.0)
    loss = float(totals["loss"]) / w
    out = {"eval_loss": loss, "eval_accuracy": float(totals["correct"]) / w}
    if self.language_model:
      out["eval_perplexity"] = math.exp(min(loss, 50.0)) if math.isfinite(loss) else loss
    if data.eval_bytes:  # nats per target token -> bits per byte of the text they stand for
      out["eval_bits_per_byte"] = float(totals["nll"]) / math.log(2) / data.eval_bytes
    out["eval_logit_mean"] = float(totals["logit_sum"]) / w
    out["eval_logit_max"] = float(totals["logit_max"])
    if data.source_names and "source_nll" in totals:  # a mixture: each source's held-out loss
      nll, weight = np.asarray(totals["source_nll"]), np.asarray(totals["source_weight"])
      for i, name in enumerate(data.source_names):
        out[f"eval_loss/{name}"] = float(nll[i]) / max(float(weight[i]), 1.0)
        if data.source_eval_bytes:
          out[f"eval_bits_per_byte/{name}"] = (
              float(nll[i]) / math.log(2) / max(data.source_eval_bytes[i], 1.0)
          )
    return out

  def frozen_runs(self, config) -> dict[str, str]:
    """{name: run folder} of the runs whose parameters the loss reads but never trains (a
    teacher): the training driver loads each run's latest intact parameters, places them on the
    run's mesh as that run's own model would be, and the steps pass them to `outputs` as
    variables["frozen"][name]. Empty for most objectives."""
    return {}

  def synthetic_frozen(self, model_cfg, config, seed: int = 0) -> dict:
    """What `outputs` reads as variables["frozen"] when no run gives it (a synthetic batch's
    step: benchmarks, the tests that run every objective): {name: parameters}, empty for most
    objectives."""
    return {}

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
    groups=None,
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
  sums is the weighted sum of log(Z)^2 either way. `groups` (a one-hot [B, G] of each row's
  group: a mixture's source) adds "source_nll" and "source_weight", [G] sums per group.
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
  sums = {
      "loss": jnp.sum(loss * w),
      "nll": jnp.sum(nll * w),
      "correct": jnp.sum(correct * w),
      "weight": jnp.sum(w),
      "z_loss": jnp.sum(lse_squared * w),
  }
  if groups is not None:
    rows = lambda x: jnp.sum(jnp.reshape(x, (x.shape[0], -1)), axis=1)  # noqa: E731
    one_hot = groups.astype(jnp.float32)
    sums["source_nll"] = rows(nll * w) @ one_hot
    sums["source_weight"] = rows(jnp.broadcast_to(w, nll.shape)) @ one_hot
  return sums


def chunked_cross_entropy(
    hidden, unembedding, model_cfg, targets, weights, chunks, label_smoothing, num_classes, z_loss
) -> dict:
  """cross_entropy's sums for logits = hidden [B, T, D] x unembedding [D, V], made `chunks`
  pieces of the sequence at a time inside a rematerialised scan: the forward pass holds one
  chunk's [B, T / chunks, V] logits, and the backward pass makes each chunk's again from its
  hidden states, so the [B, T, V] logits never exist. Equal to the whole computation up to the
  order of the sums.

  Chunk c takes every `chunks`-th token from token c on, not a contiguous stretch: where the
  tokens are split over devices (mesh.context) every device then holds T / chunks / N tokens
  of every chunk, and each step of the scan keeps all of them busy on their own tokens (a
  contiguous chunk would lie on a few devices, and the others would be handed its logits)."""
  B, T = targets.shape
  split = lambda a: jnp.moveaxis(a.reshape(B, T // chunks, chunks, *a.shape[2:]), 2, 0)  # noqa: E731

  def chunk_sums(h, t, w):
    logits = output_logits(model_cfg, jnp.einsum("btd,dv->btv", h, unembedding))
    return cross_entropy(logits, t, w, label_smoothing, num_classes, z_loss)

  def body(total, xs):
    return jax.tree_util.tree_map(jnp.add, total, chunk_sums(*xs)), None

  pieces = (split(hidden), split(targets), split(weights))
  shapes = jax.eval_shape(chunk_sums, *(p[0] for p in pieces))
  zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  total, _ = jax.lax.scan(jax.checkpoint(body, prevent_cse=False), zeros, pieces)
  return total
