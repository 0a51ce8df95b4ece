"""The KV cache of decoding: an empty cache from shapes alone, and its rows (one per sequence or
beam) repeated or gathered along the batch axis of every cached key and value."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn


def init_cache(model, *dummy_inputs, **kwargs):
  """An empty cache shaped like `model.init(*dummy_inputs)['cache']`: zeros, from shapes alone
  (jax.eval_shape: nothing is initialised or computed). A self-attention cache has as many slots
  as the dummy tokens; cross-attention entries appear on the first decode call. The write
  indices are left out: a cache without one is known (when traced) to be empty, so the first
  call (the prefill) attends over its own keys only (see Attention._cached)."""
  with nn.logical_axis_rules(()):  # shapes only: no sharding constraints while initialising
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *dummy_inputs, **kwargs))[
        "cache"
    ]

  def empty(tree):
    return {
        k: empty(v) if isinstance(v, dict) else jnp.zeros(v.shape, v.dtype)
        for k, v in tree.items()
        if k != "cache_index"
    }

  return empty(shapes)


def _row_axis(path, leaf):
  """The batch axis of a cached key/value (behind the layer axis when layers are scanned);
  None for counters."""
  if leaf.ndim < 4:
    return None
  return 1 if any(getattr(k, "key", None) == "layers" for k in path) else 0


def map_rows(cache, fn):
  """Apply fn(array, axis) to every cached key/value along its batch axis."""

  def one(path, leaf):
    axis = _row_axis(path, leaf)
    return leaf if axis is None else fn(leaf, axis)

  return jax.tree_util.tree_map_with_path(one, cache)


def repeat_rows(cache, k: int):
  return map_rows(cache, lambda x, axis: jnp.repeat(x, k, axis=axis))


def gather_rows(cache, rows):
  return map_rows(cache, lambda x, axis: jnp.take(x, rows, axis=axis))
