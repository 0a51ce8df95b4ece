"""The written-out scores' side of attention: the dense mask and score bias of every (query,
key) pair, as the reference paths (einsum, the fused call) read them, and the largest
pre-softmax score (written out, or block by block as flash visits them)."""

from __future__ import annotations

import jax.numpy as jnp

from transformers_jax.modules.common import soft_cap
from transformers_jax.modules.flash import blockwise_max_logit
from transformers_jax.modules.masks import (
    AttentionMask,
    as_dense,
    is_causal,
    with_index_positions,
)


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of an attention setting that a chosen kernel cannot run, or None."""
  if c.attention_softcap and c.attention_impl in ("splash", "fused", "cudnn"):
    fix = "its kernel has no soft-capping: use flash or einsum, or auto (which picks one)"
    return "attention_impl", repr(c.attention_impl), fix
  if c.attention_sinks and c.attention_impl == "cudnn":
    fix = "cuDNN's kernel has no attention sinks: use fused, flash or einsum, or auto"
    return "attention_impl", repr(c.attention_impl), fix
  return None


def whole_bias(bias, mask, q, k):
  """The score bias for every (query, key) pair, [B or 1, G, H/G, T, S] float32, at the mask's
  positions where it carries them (a permuted or split sequence), else at the indices."""
  mask = mask if isinstance(mask, AttentionMask) else AttentionMask()
  mask = with_index_positions(mask, q.shape[1], k.shape[1])
  return bias.block(mask.q_positions, mask.kv_positions, k.shape[2])


def dense_mask(mask, causal, T: int, S: int):
  """(dense mask or None, causal) for the reference paths: causal order by positions goes into
  the mask, causal order by index stays with the path (which skips blocks by it); a sliding
  window, a bidirectional prefix and chunks go into the mask, by index positions where the
  mask has none. `causal`: the mask's pattern decides when it is an AttentionMask."""
  causal = is_causal(mask, causal)
  if isinstance(mask, AttentionMask) and mask.needs_positions:
    return with_index_positions(mask, T, S).dense(causal=causal), False
  if isinstance(mask, AttentionMask) and mask.has_positions and causal:
    return mask.dense(causal=True), False
  return as_dense(mask), causal


def max_attention_logit(
    q, k, mask, causal: bool, blocks: tuple[int, int] | None = None, bias=None, cap: float = 0.0
):
  """The largest pre-softmax attention score q.k / sqrt(K) (+ the score `bias`, a ScoreBias or
  None; soft-capped at `cap` when it is not 0) over the positions a query may attend (float32
  scalar); q [B, T, H, K], k [B, S, G, K]. Growth of this value during training
  is the attention-logit instability that query/key normalisation removes. With `blocks`
  (block_q, block_kv) and a mask that is an AttentionMask or None, it is computed block by
  block (no T x S array), as flash and splash attention need at long T."""
  if blocks is not None and (mask is None or isinstance(mask, AttentionMask)):
    return blockwise_max_logit(q, k, mask, causal, *blocks, bias=bias, softcap=cap)
  dense_bias = None if bias is None else whole_bias(bias, mask, q, k)
  mask, causal = dense_mask(mask, causal, q.shape[1], k.shape[1])
  B, T, H, K = q.shape
  S, G = k.shape[1], k.shape[2]
  qg = q.reshape(B, T, G, H // G, K)
  s = jnp.einsum("btgrk,bsgk->bgrts", qg, k, preferred_element_type=jnp.float32)
  s = s / jnp.sqrt(jnp.float32(K))
  if dense_bias is not None:
    s = s + dense_bias
  s = soft_cap(s, cap)
  allowed = jnp.ones((1, 1, 1, T, S), bool)
  if causal:
    allowed = allowed & (jnp.arange(T)[:, None] >= jnp.arange(S)[None, :])
  if mask is not None:  # broadcastable to [B, H, T, S]
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    m = jnp.broadcast_to(m, (m.shape[0], H, T, S)).reshape(m.shape[0], G, H // G, T, S)
    allowed = allowed & m
  return jnp.max(jnp.where(allowed, s, -jnp.inf))
