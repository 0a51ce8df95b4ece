"""Encoder-decoder (the 2017 Transformer): a bidirectional stack over the source, a causal stack
with cross-attention over the target; shared, √d-scaled embeddings tied to the softmax.

`encode` and `decode_logits` are separate methods so decoding runs the encoder once; with
`decode=True` the decoder caches its self-attention keys/values, and its cross-attention projects
the encoder output on the first `decode_logits` call only (see Attention).
"""

from __future__ import annotations

from flax import linen as nn

from transformers_jax.models.common import (
    check_length,
    default_positions,
    output_logits,
    padding_mask,
)
from transformers_jax.modules.block import Stack
from transformers_jax.modules.common import dense
from transformers_jax.modules.embed import Embedder
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.positions import DecodeCounter


class EncoderDecoder(nn.Module):
  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool = True
  decode: bool = False

  def setup(self):
    c = self.cfg
    self.embed = Embedder(c, self.deterministic)  # target side, and source side when shared
    if not c.share_embeddings:
      self.src_embed = Embedder(c, self.deterministic)
    self.encoder = Stack(c, c.encoder_layers, deterministic=self.deterministic)
    self.decoder = Stack(
        c,
        c.decoder_layers,
        causal=True,
        cross=True,
        deterministic=self.deterministic,
        decode=self.decode,
    )
    if c.has_final_norm:
      self.encoder_norm = Norm(c)
      self.decoder_norm = Norm(c)
    if not c.tie_embeddings:
      self.lm_head = dense(
          c, c.padded_vocab, -1, ("embed", "vocab"), ("vocab",), None, use_bias=False
      )
    if self.decode:
      self.position = DecodeCounter()

  def encode(self, src, src_mask=None):
    """src [B, S] -> encoded [B, S, D]."""
    c = self.cfg
    B, S = src.shape
    check_length(c, S, "source")
    positions = default_positions(B, S)
    embedder = self.embed if c.share_embeddings else self.src_embed
    x = self.encoder(embedder(src, positions), padding_mask(src_mask), positions)
    return self.encoder_norm(x) if c.has_final_norm else x

  def decode_logits(self, encoded, tgt, src_mask=None, tgt_mask=None):
    """encoded [B, S, D], tgt [B, T] (teacher-forced input) -> {'hidden', 'logits' [B, T, V]}."""
    c = self.cfg
    B, T = tgt.shape
    check_length(c, T, "target")
    positions = self.position(B, T) if self.decode else default_positions(B, T)
    x = self.embed(tgt, positions)
    self_mask = None if self.decode else padding_mask(tgt_mask)  # the cache masks itself
    x = self.decoder(x, self_mask, positions, encoded, padding_mask(src_mask))
    if c.has_final_norm:
      x = self.decoder_norm(x)
    logits = self.embed.attend(x) if c.tie_embeddings else self.lm_head(x)
    return {"hidden": x, "logits": output_logits(c, logits)}

  def __call__(self, src, tgt, src_mask=None, tgt_mask=None):
    return self.decode_logits(self.encode(src, src_mask), tgt, src_mask, tgt_mask)
