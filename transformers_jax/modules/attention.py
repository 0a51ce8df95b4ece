"""Multi-head attention with grouped key/value heads (MHA, GQA, MQA), self or cross.

Shapes: x [B, T, D], context [B, S, D]; q [B, T, H, K], k and v [B, S, G, K]; H % G == 0.
`mask` is boolean and broadcastable to [B, H, T, S] (True = may attend).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.modules.common import dense
from transformers_jax.modules.positions import apply_rope


def attend(q, k, v, mask, causal: bool, dropout_fn=None):
  """softmax(q k^T / sqrt(K) + masks) v, softmax in float32.

  Without attention dropout this is `jax.nn.dot_product_attention`, so a GPU can take its fused
  kernel; with dropout on the weights the same computation is written out.
  """
  if dropout_fn is None:
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)
  heads, groups = q.shape[2], k.shape[2]
  k = jnp.repeat(k, heads // groups, axis=2)
  v = jnp.repeat(v, heads // groups, axis=2)
  logits = jnp.einsum("bthk,bshk->bhts", q, k, preferred_element_type=jnp.float32)
  logits = logits / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
  if causal:
    t, s = logits.shape[-2:]
    mask = jnp.tril(jnp.ones((t, s), bool)) if mask is None else mask & jnp.tril(
        jnp.ones((t, s), bool))
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = dropout_fn(jax.nn.softmax(logits, axis=-1)).astype(v.dtype)
  return jnp.einsum("bhts,bshk->bthk", weights, v)


class Attention(nn.Module):
  """Projections q, k, v, out; RoPE on self-attention; a key/value cache when `decode`."""

  cfg: "ModelConfig"  # noqa: F821
  causal: bool = False
  deterministic: bool = True
  decode: bool = False

  @nn.compact
  def __call__(self, x, context=None, mask=None, positions=None):
    c = self.cfg
    H, G, K, D = c.num_heads, c.kv_heads, c.head_width, c.d_model
    is_cross = context is not None
    source = context if is_cross else x
    q = dense(c, (H, K), -1, ("embed", "heads", "head_dim"), ("heads", "head_dim"), "query")(x)
    k = dense(c, (G, K), -1, ("embed", "kv_heads", "head_dim"), ("kv_heads", "head_dim"), "key")(
        source)
    v = dense(c, (G, K), -1, ("embed", "kv_heads", "head_dim"), ("kv_heads", "head_dim"),
              "value")(source)
    q = nn.with_logical_constraint(q, ("act_batch", "act_length", "act_heads", None))
    if c.positions == "rope" and not is_cross:
      q = apply_rope(q, positions, c.rope_theta)
      k = apply_rope(k, positions, c.rope_theta)
    causal = self.causal and not is_cross
    if self.decode and not is_cross:
      k, v, mask = self._cached(k, v, mask)
      causal = False  # the cache mask already hides future slots
    dropout_fn = None
    if c.attention_dropout > 0 and not self.deterministic:
      dropout_fn = nn.Dropout(c.attention_dropout, deterministic=False)
    out = attend(q, k, v, mask, causal, dropout_fn)
    return dense(c, D, (-2, -1), ("heads", "head_dim", "embed"), ("embed",), "out")(out)

  def _cached(self, k, v, mask):
    """Write this call's keys/values at the cache index; mask slots after each query's position.

    The cache holds kv heads only ([B, max_len, G, K]), so GQA/MQA shrink it by H/G.
    """
    B, T, G, K = k.shape
    L = self.cfg.max_len
    initialised = self.has_variable("cache", "cached_key")
    ck = self.variable("cache", "cached_key", jnp.zeros, (B, L, G, K), k.dtype)
    cv = self.variable("cache", "cached_value", jnp.zeros, (B, L, G, K), v.dtype)
    ci = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not initialised:  # init only shapes the cache
      return k, v, mask
    start = ci.value
    ck.value = jax.lax.dynamic_update_slice(ck.value, k.astype(ck.value.dtype), (0, start, 0, 0))
    cv.value = jax.lax.dynamic_update_slice(cv.value, v.astype(cv.value.dtype), (0, start, 0, 0))
    ci.value = start + T
    query_pos = start + jnp.arange(T)
    visible = jnp.arange(L)[None, :] <= query_pos[:, None]  # [T, L]
    cache_mask = visible[None, None]
    if mask is not None:  # a caller's mask over cache slots, [B, 1, 1 or T, L]
      cache_mask = cache_mask & mask
    return ck.value, cv.value, cache_mask
