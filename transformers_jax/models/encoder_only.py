"""Encoder-only (BERT): embeddings (+ token types, embedding norm) -> bidirectional Blocks -> head.

Heads (`model.head`): `pooler` (BertModel: tanh(W h_[CLS])), `mlm` (BertForMaskedLM: dense, act,
norm, then the decoder tied to the token embedding plus a vocabulary bias), `classifier`
(BertForSequenceClassification: pooler, dropout, dense to num_classes).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.models.common import (
    check_length,
    default_positions,
    lm_logits,
    readout,
)
from transformers_jax.modules.block import Stack
from transformers_jax.modules.context import check_context, context_size
from transformers_jax.modules.common import activation, dense, dtype_of, zeros
from transformers_jax.modules.embed import Embedder
from transformers_jax.modules.masks import token_mask
from transformers_jax.modules.norms import Norm


class EncoderOnly(nn.Module):
  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool = True
  decode: bool = False  # unused: an encoder has nothing to cache

  @nn.compact
  def __call__(
      self,
      tokens,
      attention_mask=None,
      token_types=None,
      positions=None,
      segment_ids=None,
      pool_starts=None,
  ):
    """tokens [B, S] -> {'hidden', and 'pooled' / 'logits' as the head gives}.

    `segment_ids` [B, S] (packed rows): a token attends only tokens of its own segment; pass
    `positions` that restart at each segment. The pooled heads read position 0, or with
    `pool_starts` [B, K] (packed rows) the token at each of those indices, each segment's first:
    'pooled' is then [B, K, D] and the classifier's 'logits' [B, K, classes].
    """
    c = self.cfg
    B, S = tokens.shape
    check_length(c, S)
    check_context(S, context_size())  # bidirectional: split in natural order over `context`
    if positions is None:
      positions = default_positions(B, S)
    embedder = Embedder(c, self.deterministic, name="embed")
    x = embedder(tokens, positions, token_types)
    x = Stack(c, c.num_layers, deterministic=self.deterministic, name="encoder")(
        x, token_mask(attention_mask, segment_ids), positions
    )
    if c.has_final_norm:
      x = Norm(c, name="final_norm")(x)
    out = {"hidden": x}
    head = c.head_kind
    if head in ("pooler", "classifier"):
      first = (
          x[:, 0]
          if pool_starts is None
          else jnp.take_along_axis(x, pool_starts[:, :, None].astype(jnp.int32), axis=1)
      )
      out["pooled"] = jnp.tanh(
          dense(c, c.d_model, -1, ("embed", "embed_out"), ("embed_out",), "pooler")(first)
      )
    if head == "classifier":
      pooled = nn.Dropout(c.dropout)(out["pooled"], deterministic=self.deterministic)
      classify = dense(c, c.num_classes, -1, ("embed", "classes"), ("classes",), "classifier")
      out["logits"] = readout(c, classify(pooled).astype(jnp.float32))
    if head == "mlm":
      act = activation("gelu" if c.gated else c.activation)
      h = act(dense(c, c.d_model, -1, ("embed", "embed_out"), ("embed_out",), "mlm_transform")(x))
      h = Norm(c, name="mlm_norm")(h)
      bias = self.param("mlm_bias", zeros(("vocab",)), (c.padded_vocab,), dtype_of(c.param_dtype))
      out["logits"] = lm_logits(c, embedder, h, name="mlm_decoder", bias=bias)
    return out
