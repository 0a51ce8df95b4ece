"""Position schemes that act on the embeddings alone (or not at all): none, a learned table,
and the 2017 Transformer's fixed sinusoids in either column layout."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformers_jax.modules import inits
from transformers_jax.modules.common import dtype_of, normal
from transformers_jax.modules.positions.base import PositionScheme


def sinusoidal_table(length: int, d_model: int, halves: bool = False) -> np.ndarray:
  """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) (Vaswani et al.).

  Columns interleave sine and cosine as in the paper: column 2i is sin, column 2i + 1 is cos.
  With `halves` the same values lie as Marian lays them: all sines, then all cosines.
  """
  pos = np.arange(length, dtype=np.float64)[:, None]
  i = np.arange(d_model // 2, dtype=np.float64)[None, :]
  angle = pos / 10000.0 ** (2.0 * i / d_model)
  if halves:
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1).astype(np.float32)
  table = np.empty((length, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle)
  return table.astype(np.float32)


class NoPositions(PositionScheme):
  """No positional information: attention is then permutation-equivariant."""

  summary = "no position information: attention is permutation-equivariant"


class Learned(PositionScheme):
  """A trained table of max_len rows added to the token embeddings (BERT, GPT-2); with
  model.position_offset = n, n more rows come first and position p reads row p + n (BART's 2)."""

  summary = "a trained table of max_len rows added to the token embeddings (BERT, GPT-2)"

  def embedding_table(self, c):
    return nn.Embed(
        c.seq_len_max + c.position_offset,
        c.d_model,
        dtype=dtype_of(c.dtype),
        param_dtype=dtype_of(c.param_dtype),
        embedding_init=normal(inits.embedding_std(c), ("position", "embed")),
    )

  def add_to_embeddings(self, c, x, positions, table):
    return x + table(positions + c.position_offset if c.position_offset else positions)


class Sinusoidal(PositionScheme):
  """The 2017 Transformer's fixed sinusoids added to the embeddings."""

  summary = (
      "the 2017 Transformer's fixed sinusoids added to the embeddings, sin and cos interleaved"
  )
  halves = False

  def add_to_embeddings(self, c, x, positions, table):
    values = sinusoidal_table(c.seq_len_max, c.d_model, self.halves)
    return x + jnp.asarray(values, x.dtype)[positions]

  def config_problem(self, c):
    if c.d_model % 2:
      return "d_model", str(c.d_model), "sinusoidal positions need an even d_model"
    return super().config_problem(c)


class SinusoidalHalves(Sinusoidal):
  """The same fixed sinusoids with all sines before all cosines (Marian's layout)."""

  summary = "the same fixed sinusoids, all sines before all cosines (Marian's layout)"
  halves = True
