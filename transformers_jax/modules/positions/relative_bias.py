"""T5's relative attention bias (Raffel et al.): a learned scalar per head and bucket of the
key - query offset, added to every self-attention's scores."""

from __future__ import annotations

import math

import jax.numpy as jnp

from transformers_jax.modules.common import normal
from transformers_jax.modules.positions.base import PositionScheme, ScoreBias, bias_param


def relative_bucket(relative, bidirectional: bool, num_buckets: int, max_distance: int):
  """T5's bucket of each offset `relative` = key position - query position (int array).

  Half the buckets (or, bidirectional, half of each direction's half) hold exact offsets 0, 1,
  …; the rest cover offsets up to `max_distance` in logarithmically growing ranges, and every
  farther offset shares the last bucket. Causal (not bidirectional) buckets count only keys at
  or before the query; later keys share bucket 0 with the query itself (a causal mask hides
  them anyway)."""
  relative = relative.astype(jnp.int32)
  bucket = jnp.zeros_like(relative)
  if bidirectional:
    num_buckets //= 2
    bucket = jnp.where(relative > 0, num_buckets, 0)
    distance = jnp.abs(relative)
  else:
    distance = jnp.maximum(-relative, 0)
  exact = num_buckets // 2
  scaled = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / exact) / math.log(
      max_distance / exact
  )
  far = exact + (scaled * (num_buckets - exact)).astype(jnp.int32)
  far = jnp.minimum(far, num_buckets - 1)
  return bucket + jnp.where(distance < exact, distance, far)


class RelativeBias(PositionScheme):
  """T5's relative attention bias (Raffel et al.): a learned scalar per head and bucket of the
  offset key - query (model.relative_buckets buckets, log-spaced up to
  model.relative_max_distance), one table per stack shared by its layers; bidirectional buckets
  in an encoder, causal ones in a decoder."""

  summary = "T5's relative bias: a learned scalar per head and bucket of the key - query offset"

  def score_bias(self, c, stack, causal):
    init = normal(c.init_std, ("relative_buckets", "heads"))
    table = bias_param(stack, c, "relative_bias", init, (c.relative_buckets, c.num_heads))
    return ScoreBias(table, c.positions, not causal, c.relative_max_distance)

  def bias_scores(self, bias, relative):
    buckets = bias.weights.shape[0]
    bucket = relative_bucket(relative, bias.bidirectional, buckets, bias.max_distance)
    return jnp.moveaxis(bias.weights.astype(jnp.float32)[bucket], -1, 1)

  def config_problem(self, c):
    problem = super().config_problem(c)
    if problem:
      return problem
    if c.relative_buckets < 4 or c.relative_buckets % 2:
      return "relative_buckets", str(c.relative_buckets), "use an even number >= 4 (T5: 32)"
    if c.relative_max_distance <= c.relative_buckets // 2:
      return (
          "relative_max_distance",
          str(c.relative_max_distance),
          f"must exceed relative_buckets / 2 = {c.relative_buckets // 2} (T5: 128)",
      )
    return None
