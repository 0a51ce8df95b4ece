"""Attention over a key/value cache (decoding): what `Attention` runs once its cache exists."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformers_jax.modules.common import soft_cap


def attend_cache(
    q, k, v, mask, k_new=None, v_new=None, new_mask=None, bias=None, new_bias=None, softcap=0.0
):
  """Attention of q [B, T, H, K] over keys/values kept as a cache, k and v [B, G, L, K] (kv heads
  before slots, so both products are batched matmuls over the cache as it lies), plus
  optionally this call's own T keys/values k_new, v_new [B, G, T, K]: one softmax over the L + T
  keys. Reading the cache as it was before this call lets the caller update it in place.
  mask [B, 1, T, L] and new_mask [B, 1, T, T]: boolean (True = may attend) or None; bias
  [B or 1, G, H/G, T, L] and new_bias [.., T, T]: float32 score biases or None."""
  B, T, H, K = q.shape
  G = k.shape[1]
  R = H // G  # query heads per kv head; query head h uses kv head h // R

  def scores(keys, m, b):
    s = jnp.einsum("bgqk,bglk->bgql", qg, keys, preferred_element_type=jnp.float32)
    s = s / jnp.sqrt(K).astype(jnp.float32)
    if b is not None:
      s = s + b.reshape(b.shape[0], G, R * T, b.shape[-1])
    s = soft_cap(s, softcap)  # Gemma 2's, before the mask
    if m is None:
      return s
    n = keys.shape[2]
    m = jnp.broadcast_to(jnp.broadcast_to(m, (B, 1, T, n))[:, :, None], (B, G, R, T, n))
    return jnp.where(m.reshape(B, G, R * T, n), s, jnp.finfo(jnp.float32).min)

  qg = q.reshape(B, T, G, R, K).transpose(0, 2, 3, 1, 4).reshape(B, G, R * T, K)
  logits = scores(k, mask, bias)
  if k_new is not None:
    logits = jnp.concatenate([logits, scores(k_new, new_mask, new_bias)], axis=-1)
  weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  L = k.shape[2]
  out = jnp.einsum("bgql,bglk->bgqk", weights[..., :L], v)
  if k_new is not None:
    out = out + jnp.einsum("bgqt,bgtk->bgqk", weights[..., L:], v_new)
  return out.reshape(B, G, R, T, K).transpose(0, 3, 1, 2, 4).reshape(B, T, H, K)
