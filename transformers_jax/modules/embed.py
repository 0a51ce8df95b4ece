"""Token, position and token-type embeddings, with the tied unembedding."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformers_jax.modules import inits, quantization
from transformers_jax.modules.common import constant, dtype_of, normal
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.positions import position_scheme


class Embedder(nn.Module):
  """tokens [B, T] (or already-embedded vectors, e.g. ViT patches) -> residual stream [B, T, D].

  Adds what the position scheme adds to embeddings (modules/positions/: a learned table or
  fixed sinusoids; the others act inside attention), token types, then the optional embedding
  norm (BERT) and dropout. `attend` is the tied unembedding x E^T. With `tokens=False` it has no
  token table and is always given `embedded` (BART's encoder: its own positions and norm over the
  token table the decoder's embedder holds).
  """

  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool = True
  tokens: bool = True

  def setup(self):
    c = self.cfg
    dt, pdt = dtype_of(c.dtype), dtype_of(c.param_dtype)

    def table(rows, std, axis):  # [rows, d_model], normal(std), the rows over logical `axis`
      init = normal(std, (axis, "embed"))
      return nn.Embed(rows, c.d_model, dtype=dt, param_dtype=pdt, embedding_init=init)

    if self.tokens:
      self.token_embed = table(c.padded_vocab, inits.token_embedding_std(c), "vocab")
      if c.embed_scale_learned and c.family != "vit":  # (a ViT embeds patches: refused)
        self.embed_gain = self.param("embed_gain", constant(np.sqrt(c.d_model), ()), (), pdt)
    self.pos_embed = position_scheme(c).embedding_table(c)
    if c.type_vocab_size:
      self.type_embed = table(c.type_vocab_size, inits.embedding_std(c), "type_vocab")
    if c.has_embed_norm:
      self.embed_norm = Norm(c)
    self.dropout = nn.Dropout(c.dropout)

  def __call__(self, tokens=None, positions=None, token_types=None, embedded=None):
    c = self.cfg
    x = self.token_embed(tokens) if embedded is None else embedded
    if c.embed_scale:
      x = x * jnp.asarray(np.sqrt(c.d_model), x.dtype)
    if c.embed_scale_learned and embedded is None:  # a learned gain (DyT's LLM recipe)
      x = x * self.embed_gain.astype(x.dtype)
    x = position_scheme(c).add_to_embeddings(c, x, positions, self.pos_embed)
    if c.type_vocab_size:
      x = x + self.type_embed(jnp.zeros_like(positions) if token_types is None else token_types)
    if c.has_embed_norm:
      x = self.embed_norm(x)
    x = nn.with_logical_constraint(x, ("act_batch", "act_length", "act_embed"))
    return self.dropout(x, deterministic=self.deterministic)

  def attend(self, x):
    """x [..., D] -> x E^T, quantized when model.quantization_head says (else as nn.Embed's)."""
    mode = quantization.head_mode(self.cfg)
    if not mode:
      return self.token_embed.attend(x)
    table = self.token_embed.embedding.astype(dtype_of(self.cfg.dtype))
    return quantization.tensordot(x.astype(table.dtype), table.T, 1, mode)
