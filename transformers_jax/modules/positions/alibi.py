"""ALiBi (Press et al., 2022): no position embeddings; each head adds a fixed slope times the
query - key distance to its scores."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from transformers_jax.modules.positions.base import PositionScheme, ScoreBias


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi's per-head slopes (Press et al., 2022): the geometric sequence 2^(-8 i / n), i = 1..n,
  for n heads a power of two; otherwise those of the nearest smaller power of two followed by
  every other slope of the next power of two."""

  def powers(n):
    return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

  below = 2 ** int(math.floor(math.log2(num_heads)))
  slopes = powers(below) + powers(2 * below)[0::2][: num_heads - below]
  return np.asarray(slopes, np.float32)


class ALiBi(PositionScheme):
  """ALiBi (Press et al.): no embeddings; each head h adds -slope_h * |query - key| to its scores
  (fixed slopes, alibi_slopes)."""

  summary = "ALiBi: each head adds -slope * |query - key| to its scores (fixed slopes, no weights)"

  def score_bias(self, c, stack, causal):
    return ScoreBias(jnp.asarray(alibi_slopes(c.num_heads)), c.positions, not causal)

  def bias_scores(self, bias, relative):
    distance = jnp.abs(relative).astype(jnp.float32)[:, None]
    return -bias.weights.astype(jnp.float32)[None, :, None, None] * distance
