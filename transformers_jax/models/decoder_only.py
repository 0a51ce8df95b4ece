"""Decoder-only (GPT-2 / GPT-3): embeddings -> causal Blocks -> final norm -> (tied) unembedding."""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.models.common import (
    check_length,
    default_positions,
    lm_logits,
    unembedding,
)
from transformers_jax.models.mtp import MultiTokenPrediction, future_tokens
from transformers_jax.modules.block import Stack
from transformers_jax.modules.context import context_size, from_zigzag, to_zigzag
from transformers_jax.modules.embed import Embedder
from transformers_jax.modules.masks import token_mask, with_pattern
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.positions import DecodeCounter


class DecoderOnly(nn.Module):
  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool = True
  decode: bool = False

  @nn.compact
  def __call__(
      self,
      tokens,
      attention_mask=None,
      positions=None,
      last_logits_only=False,
      segment_ids=None,
      prefix_lengths=None,
      mtp_tokens=None,
  ):
    """tokens [B, T] -> {'hidden': [B, T, D], 'logits': [B, T, V] float32, 'unembedding':
    [D, V]} (the matrix of the logits; not when decoding).

    With `decode=True` (the KV cache, see Attention) `attention_mask` is over the cache's L slots
    ([B, L], 1 = a real token), and `positions` default to the cache's running count; a batch
    of left-padded prompts passes each row's own positions (transformers_jax.decode does).
    `last_logits_only`: logits of the last position only ([B, 1, V]; a prefill needs no more).
    `segment_ids` [B, T] (packed rows, not with `decode`): a token attends only earlier tokens of
    its own segment; pass `positions` that restart at each segment.
    `prefix_lengths` [B] (a prefix LM, tasks/prefix_lm.py): the tokens at positions below a
    row's length attend one another both ways, the rest causally (modules/masks.py).
    Under a mesh with `context` > 1 the tokens run through the blocks in zig-zag order, split
    over `context` (modules/context.py); outputs come back in the order of `tokens`.
    `mtp_tokens` [B, >= T] (with model.mtp_depth; the training row, tasks/mtp.py): also
    'mtp_hidden' [mtp_depth, B, T, D], each multi-token prediction depth's final-normed
    representation (models/mtp.py), which 'unembedding' turns into its logits.
    """
    c = self.cfg
    B, T = tokens.shape
    row = tokens if mtp_tokens is None else mtp_tokens  # (before any reordering)
    check_length(c, T)
    if positions is None:
      positions = DecodeCounter(name="position")(B, T) if self.decode else default_positions(B, T)
    shards = context_size()
    if shards > 1:
      if self.decode:
        raise ValueError(
            "KV-cache decoding does not split over mesh.context: decode with mesh.context=1"
        )
      tokens, positions, attention_mask, segment_ids = (
          to_zigzag(a, shards) for a in (tokens, positions, attention_mask, segment_ids)
      )
    embedder = Embedder(c, self.deterministic, name="embed")
    x = embedder(tokens, positions)
    mask = with_pattern(token_mask(attention_mask, segment_ids), True, prefix_lengths)
    x = Stack(
        c,
        c.num_layers,
        causal=True,
        deterministic=self.deterministic,
        decode=self.decode,
        name="decoder",
    )(x, mask, positions)
    out = {}
    if c.mtp_depth and not self.decode and (mtp_tokens is not None or self.is_initializing()):
      ahead = [to_zigzag(future_tokens(row, k + 1, T), shards) for k in range(c.mtp_depth)]
      embedded = jnp.stack([embedder(a, positions) for a in ahead])
      mtp = MultiTokenPrediction(c, self.deterministic, name="mtp")(x, embedded, mask, positions)
      out["mtp_hidden"] = jnp.stack([from_zigzag(h, shards) for h in mtp])
    if c.has_final_norm:
      x = Norm(c, name="final_norm")(x)
    x = from_zigzag(x, shards)
    logits = lm_logits(c, embedder, x[:, -1:] if last_logits_only else x)
    out = {"hidden": x, "logits": logits, **out}
    if not self.decode:  # what a loss over chunks of tokens multiplies by (unused: no cost)
      out["unembedding"] = unembedding(c, self)
    return out
