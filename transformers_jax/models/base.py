"""What the four families share besides the Block: input checks, default positions, masks, heads."""

from __future__ import annotations

import jax.numpy as jnp

from transformers_jax.modules.common import dense


def check_length(cfg, length: int, what: str = "sequence") -> None:
  """Refuse (at trace time, before any compute) a sequence longer than the position range."""
  if length > cfg.seq_len_max:
    raise ValueError(
        f"{what} length {length} exceeds model.max_len={cfg.seq_len_max}: "
        "shorten the input or raise model.max_len")


def default_positions(batch: int, length: int):
  return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


def padding_mask(query_mask, key_mask=None):
  """[B, T] and [B, S] 0/1 masks -> boolean [B, 1, T or 1, S] (None if no mask is given).

  Only keys are masked when just one mask is given: rows of padded queries stay finite and are
  ignored by the loss.
  """
  if key_mask is None and query_mask is None:
    return None
  keys = query_mask if key_mask is None else key_mask
  return keys.astype(bool)[:, None, None, :]


def lm_logits(cfg, embedder, x, name="lm_head"):
  """Tied (x E^T) or separate unembedding; logits in float32 for the loss."""
  if cfg.tie_embeddings:
    logits = embedder.attend(x)
  else:
    logits = dense(cfg, cfg.vocab_size, -1, ("embed", "vocab"), ("vocab",), name,
                   use_bias=False)(x)
  return logits.astype(jnp.float32)
