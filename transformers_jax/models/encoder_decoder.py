"""Encoder-decoder (the 2017 Transformer): a bidirectional stack over the source, a causal stack
with cross-attention over the target; shared, √d-scaled embeddings tied to the softmax.

`encode` and `decode_logits` are separate methods so decoding runs the encoder once; with
`decode=True` the decoder caches its self-attention keys/values, and its cross-attention projects
the encoder output on the first `decode_logits` call only (see Attention).
"""

from __future__ import annotations

from flax import linen as nn

from transformers_jax.models.common import (
    LogitGain,
    check_length,
    default_positions,
    has_logit_gain,
    output_logits,
    unembedding_input,
)
from transformers_jax.modules.block import Stack
from transformers_jax.modules.context import (
    check_context,
    context_size,
    from_zigzag,
    to_zigzag,
)
from transformers_jax.modules.common import dense
from transformers_jax.modules.embed import Embedder
from transformers_jax.modules.masks import token_mask
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.positions import DecodeCounter
from transformers_jax.modules.quantization import head_mode


class EncoderDecoder(nn.Module):
  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool = True
  decode: bool = False

  def setup(self):
    c = self.cfg
    self.embed = Embedder(c, self.deterministic)  # target side, and source side when shared
    if not c.share_embeddings:
      self.src_embed = Embedder(c, self.deterministic)
    elif c.stack_embeddings:  # the source's own positions and norm over the shared token table
      self.src_embed = Embedder(c, self.deterministic, tokens=False)
    self.encoder = Stack(c, c.encoder_layers, deterministic=self.deterministic, role="encoder")
    self.decoder = Stack(  # its own heads and feed-forward width where the config gives them
        c.stack_config("decoder"),
        c.decoder_layers,
        causal=True,
        cross=True,
        deterministic=self.deterministic,
        decode=self.decode,
        role="decoder",
    )
    if c.has_final_norm:
      self.encoder_norm = Norm(c)
      self.decoder_norm = Norm(c)
    if not c.tie_embeddings:
      names = ("embed", "vocab"), ("vocab",)
      self.lm_head = dense(c, c.padded_vocab, -1, *names, None, False, quantized=head_mode(c))
    if has_logit_gain(c):
      self.logit_gain = LogitGain(c)
    if self.decode:
      self.position = DecodeCounter()

  def encode(self, src, src_mask=None, src_segments=None, src_positions=None):
    """src [B, S] -> encoded [B, S, D]. Packed rows pass `src_segments` [B, S] (a token attends
    only its own segment) and `src_positions` restarting at each segment."""
    c = self.cfg
    B, S = src.shape
    check_length(c, S, "source")
    check_context(S, context_size(), "source")  # bidirectional: natural order over `context`
    positions = default_positions(B, S) if src_positions is None else src_positions
    if c.stack_embeddings:
      x = self.src_embed(positions=positions, embedded=self.embed.token_embed(src))
    else:
      x = (self.embed if c.share_embeddings else self.src_embed)(src, positions)
    mask = token_mask(src_mask, src_segments)
    x = self.encoder(x, mask, positions)
    return self.encoder_norm(x) if c.has_final_norm else x

  def decode_logits(
      self,
      encoded,
      tgt,
      src_mask=None,
      tgt_mask=None,
      src_segments=None,
      tgt_segments=None,
      tgt_positions=None,
  ):
    """encoded [B, S, D], tgt [B, T] (teacher-forced input) -> {'hidden', 'logits' [B, T, V]}.

    Packed rows (training only): target segment i attends its own earlier tokens and the source
    tokens of segment i; `tgt_positions` restart at each segment."""
    c = self.cfg
    B, T = tgt.shape
    check_length(c, T, "target")
    if self.decode:
      positions = self.position(B, T)
    else:
      positions = default_positions(B, T) if tgt_positions is None else tgt_positions
    shards = context_size()
    if shards > 1:  # causal: zig-zag order over `context` (modules/context.py)
      if self.decode:
        raise ValueError(
            "KV-cache decoding does not split over mesh.context: decode with mesh.context=1"
        )
      tgt, positions, tgt_mask, tgt_segments = (
          to_zigzag(a, shards) for a in (tgt, positions, tgt_mask, tgt_segments)
      )
    x = self.embed(tgt, positions)
    self_mask = None  # the cache masks itself
    if not self.decode:
      self_mask = token_mask(tgt_mask, tgt_segments)
    cross_mask = token_mask(src_mask, tgt_segments, src_segments)
    x = self.decoder(x, self_mask, positions, encoded, cross_mask)
    if c.has_final_norm:
      x = self.decoder_norm(x)
    x = from_zigzag(x, shards)
    scaled = unembedding_input(c, x)
    logits = self.embed.attend(scaled) if c.tie_embeddings else self.lm_head(scaled)
    if has_logit_gain(c):
      logits = self.logit_gain(logits)
    return {"hidden": x, "logits": output_logits(c, logits)}

  def __call__(self, src, tgt, src_mask=None, tgt_mask=None, packing=None):
    """`packing`: None, or a dict of src_segments, src_positions, tgt_segments, tgt_positions
    ([B, S] / [B, T]) for packed rows."""
    p = packing or {}
    encoded = self.encode(src, src_mask, p.get("src_segments"), p.get("src_positions"))
    return self.decode_logits(
        encoded,
        tgt,
        src_mask,
        tgt_mask,
        p.get("src_segments"),
        p.get("tgt_segments"),
        p.get("tgt_positions"),
    )
