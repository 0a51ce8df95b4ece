"""Log-likelihoods of token sequences under a decoder-only model, batched on a mesh: what the
lm-eval adapter (adapter.py) asks of the model, with no lm-eval in it.

A row is (tokens, n): the sum of log P(token | the tokens before it) over its last n tokens, and
whether each of them is the model's most likely next token (greedy). Rows are sorted by length,
cut into batches of `batch_size` rows (the last filled with empty rows), right-padded to a
power-of-two length (at most model.max_len): one compiled program per length bucket, and
padding after a row's tokens changes nothing before them (causal attention). With a mesh, the
batch rows are split over its data-parallel axes and the parameters keep their placement.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from transformers_jax.machine import parallel
from transformers_jax.models import as_model_config, build_model, param_shardings

MIN_BUCKET = 16  # shortest padded length: tiny prompts share one program


@functools.lru_cache(maxsize=16)
def _program(cfg):
  """jit((params, tokens [B, T], targets [B, T], weights [B, T]) -> (sum of the weighted
  targets' log-probabilities [B], every weighted target greedy [B])) of model `cfg`."""
  model = build_model(cfg)

  def score(params, tokens, targets, weights):
    logits = model.apply({"params": params}, tokens)["logits"].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    scored = weights > 0
    total = jnp.sum(jnp.where(scored, picked, 0.0), axis=-1)
    greedy = jnp.all(jnp.where(scored, jnp.argmax(logits, axis=-1) == targets, True), axis=-1)
    return total, greedy

  return jax.jit(score)


def bucket(length: int, max_len: int) -> int:
  """The padded length of a batch whose longest input has `length` tokens."""
  padded = MIN_BUCKET
  while padded < length:
    padded *= 2
  return min(padded, max_len)


class Scorer:
  """Sums of log-probabilities of a decoder-only model (`params`: host arrays, placed on `mesh`
  as the logical-axis `rules` say, or arrays already placed there, e.g. a training state's)."""

  def __init__(self, model_cfg, params, mesh=None, batch_size: int = 16, rules=None):
    self.cfg = as_model_config(model_cfg)
    if self.cfg.family != "decoder":
      raise ValueError(
          f"scoring needs a decoder-only language model, not model.family={self.cfg.family}"
      )
    self.mesh, self.batch_size = mesh, batch_size
    if mesh is not None and not _placed_on(params, mesh):
      shardings = param_shardings(self.cfg, mesh, rules)
      params = jax.tree_util.tree_map(_put, params, shardings)
    self.params = params
    self.row_sharding = None
    if mesh is not None:
      shards = int(np.prod([mesh.shape[a] for a in parallel.BATCH_AXES]))
      spec = PartitionSpec(parallel.BATCH_AXES) if batch_size % shards == 0 else PartitionSpec()
      self.row_sharding = NamedSharding(mesh, spec)

  def score(self, rows: Sequence[tuple[Sequence[int], int]]) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) of the last n tokens of each (tokens, n) row, given the tokens
    before them; a row holds at most model.max_len + 1 tokens and n <= len(tokens) - 1."""
    max_len = self.cfg.max_len
    for tokens, n in rows:
      if not 1 <= n < len(tokens) or len(tokens) > max_len + 1:
        raise ValueError(
            f"a row of {len(tokens)} tokens scoring its last {n}: rows hold 2..{max_len + 1} "
            "tokens (model.max_len + 1) and score 1..len - 1 of them"
        )
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    out: list[tuple[float, bool] | None] = [None] * len(rows)
    for start in range(0, len(order), self.batch_size):
      chosen = order[start : start + self.batch_size]
      T = bucket(len(rows[chosen[0]][0]) - 1, max_len)
      tokens = np.zeros((self.batch_size, T), np.int32)
      targets = np.zeros((self.batch_size, T), np.int32)
      weights = np.zeros((self.batch_size, T), np.float32)
      for r, i in enumerate(chosen):
        seq, n = rows[i]
        length = len(seq) - 1
        tokens[r, :length], targets[r, :length] = seq[:-1], seq[1:]
        weights[r, length - n : length] = 1.0
      totals, greedy = jax.device_get(
          _program(self.cfg)(self.params, *(self._place(a) for a in (tokens, targets, weights)))
      )
      for r, i in enumerate(chosen):
        out[i] = (float(totals[r]), bool(greedy[r]))
    return out

  def _place(self, array: np.ndarray):
    if self.row_sharding is None:
      return array
    return _put(array, self.row_sharding)


def _put(array, sharding):
  """A host array (the same on every process) as a global array laid out by `sharding`."""
  array = np.asarray(array)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def _placed_on(params, mesh) -> bool:
  """Whether every leaf of `params` is already a jax.Array on `mesh`'s devices."""
  leaves = jax.tree_util.tree_leaves(params)
  devices = set(mesh.devices.flat)
  return all(isinstance(x, jax.Array) and set(x.sharding.device_set) == devices for x in leaves)
