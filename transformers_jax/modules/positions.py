"""Positional information: the 2017 sinusoids, RoPE, and the decode-time position counter.

Learned positions are an `nn.Embed` table in the embedder; `none` adds nothing.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import linen as nn


def sinusoidal_table(length: int, d_model: int) -> np.ndarray:
  """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) (Vaswani et al.).

  Columns interleave sine and cosine as in the paper: column 2i is sin, column 2i + 1 is cos.
  """
  pos = np.arange(length, dtype=np.float64)[:, None]
  i = np.arange(d_model // 2, dtype=np.float64)[None, :]
  angle = pos / 10000.0 ** (2.0 * i / d_model)
  table = np.empty((length, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle)
  return table.astype(np.float32)


def rope_angles(positions, head_dim: int, theta: float):
  """Angles [..., head_dim/2]: position * theta^(-2i/head_dim)."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
  return positions.astype(jnp.float32)[..., None] * inv_freq


def apply_rope(x, positions, theta: float):
  """Rotate feature pairs (i, i + K/2) of x [B, T, N, K] by angle(position, i).

  The half-split pairing (as in GPT-NeoX and LLaMA) rather than adjacent pairs: the two are the
  same rotation up to a fixed permutation of features, so q.k depends only on the offset either way.
  """
  angles = rope_angles(positions, x.shape[-1], theta)[:, :, None, :]  # [B, T, 1, K/2]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  xf = x.astype(jnp.float32)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class DecodeCounter(nn.Module):
  """Positions of the tokens fed in this decode call: [index, index + T); advances the index."""

  @nn.compact
  def __call__(self, batch: int, length: int):
    initialised = self.has_variable("cache", "index")
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    start = index.value
    if initialised:
      index.value = start + length
    return jnp.broadcast_to(start + jnp.arange(length, dtype=jnp.int32), (batch, length))
