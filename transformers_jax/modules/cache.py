"""The key/value cache (decoding): how `Attention` writes it (`write_cache`, `cross_cached`)
and attends over it once it exists (`attend_cache`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformers_jax.modules import quantization
from transformers_jax.modules.common import soft_cap
from transformers_jax.modules.positions import index_positions
from transformers_jax.modules.sinks import grouped, softmax_with_sink


def attend_cache(
    q,
    k,
    v,
    mask,
    k_new=None,
    v_new=None,
    new_mask=None,
    bias=None,
    new_bias=None,
    softcap=0.0,
    sinks=None,
):
  """Attention of q [B, T, H, K] over keys/values kept as a cache, k and v [B, G, L, K] (kv heads
  before slots, so both products are batched matmuls over the cache as it lies), plus
  optionally this call's own T keys/values k_new, v_new [B, G, T, K]: one softmax over the L + T
  keys. Reading the cache as it was before this call lets the caller update it in place.
  mask [B, 1, T, L] and new_mask [B, 1, T, T]: boolean (True = may attend) or None; bias
  [B or 1, G, H/G, T, L] and new_bias [.., T, T]: float32 score biases or None; `sinks` [H]
  attention sinks (modules/sinks.py) in the softmax's denominator, or None."""
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
  sink = None if sinks is None else jnp.repeat(grouped(sinks, G), T, axis=1)[None, :, :, None]
  weights = softmax_with_sink(logits, sink).astype(v.dtype)
  L = k.shape[2]
  out = jnp.einsum("bgql,bglk->bgqk", weights[..., :L], v)
  if k_new is not None:
    out = out + jnp.einsum("bgqt,bgtk->bgqk", weights[..., L:], v_new)
  return out.reshape(B, G, R, T, K).transpose(0, 3, 1, 2, 4).reshape(B, T, H, K)


def cross_cached(module, project, context):
  """An Attention `module`'s context keys/values [B, G, S, K] when decoding: projected by the
  first decode call, then reused (whether they are cached is known when a step is traced)."""
  if module.has_variable("cache", "cross_key"):
    return module.get_variable("cache", "cross_key"), module.get_variable("cache", "cross_value")
  k, v = (x.transpose(0, 2, 1, 3) for x in project(context))
  if not module.is_initializing():  # init only builds the parameters and the self-attn cache
    module.put_variable("cache", "cross_key", k)
    module.put_variable("cache", "cross_value", v)
  return k, v


def write_cache(
    module, k, v, mask, bias=None, window=None, pattern=None, chunk=None, positions=None
):
  """Write an Attention `module`'s keys/values of this call into its cache ("cache" variables)
  and return the arguments of `attend_cache`:
  the cache as it was ([B, G, S, K]) with the mask of its slots written before this call, and
  this call's keys/values ([B, G, T, K]) with their causal mask. Attention thus reads the
  cache from before the write, which XLA can then do in place. A cache without a
  `cache_index` (decode.init_cache makes them) is empty: its first call, the prefill, attends
  over its own keys only. A query always sees its own key, so rows of padding (whose slots a
  caller's `mask` over the L positions hides) stay finite.

  Without a window or chunks, or with ones traced under a scan (layers that differ), the cache
  has one slot per position (S = L, as many as the init input) and position p sits in slot p.
  With a static sliding `window` (or `chunk`: the block's own chunks, modules/layer_types.py)
  it is a ring of S = min(L, window) slots, position p in slot p mod S: a query sees only the
  keys fewer than `window` positions back (the keys of its own chunk lie fewer than `chunk`
  back), which the ring still holds (Mistral's rolling cache; Gemma 2's and 3's local layers
  and Llama 4's chunked ones when layers are looped). The window, chunks, a score `bias` and
  the caller's `mask` are evaluated at the positions the slots hold: a window and a bias depend
  only on key - query offsets, which slot positions keep even for left-padded rows; chunks
  depend on the tokens' own positions, the slot's shifted by the row's (`positions` [B, T],
  this call's, give the shift by the last token: a left-padded row's chunks start where its
  tokens do). The
  `pattern`'s prefix (a prefix LM's prompt: its tokens see each other) applies by cache slot;
  its causal order is the cache's own.

  `v` None: the values are the keys themselves (multi-head latent attention's compressed
  latent, modules/mla.py), and the cache holds the one array.
  """
  B, T, G, K = k.shape
  shared = v is None
  v = k if shared else v
  chunk = getattr(pattern, "chunk", None) if chunk is None else chunk
  # static: this layer keeps only the last `span` positions
  spans = [s for s in (window, chunk) if isinstance(s, int)]
  ring = bool(spans)
  span = min(spans) if ring else None
  initialised = module.has_variable("cache", "cached_key")
  empty = initialised and not module.has_variable("cache", "cache_index")  # static
  shape = (B, G, min(T, span) if ring else T, K)  # init: as many positions as the input
  # int8 (model.kv_cache_dtype): the keys and values in int8 beside float32 scales [B, G, S, 1]
  # (one per token and kv head), dequantized as they are read
  int8 = module.cfg.kv_cache_dtype == "int8"
  stored = jnp.int8 if int8 else k.dtype
  ck = module.variable("cache", "cached_key", jnp.zeros, shape, stored)
  cv = ck if shared else module.variable("cache", "cached_value", jnp.zeros, shape, stored)
  scales = []
  if int8:
    for name in ("cached_key_scale",) if shared else ("cached_key_scale", "cached_value_scale"):
      scales.append(module.variable("cache", name, jnp.ones, (*shape[:3], 1), jnp.float32))
  ci = module.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
  if not initialised:
    return None
  S = ck.value.shape[2]
  if T > S and not ring:
    raise ValueError(
        f"{T} tokens do not fit a key/value cache of {S} slots: initialise the "
        "cache with a longer input"
    )
  start = ci.value
  dtype = k.dtype if int8 else ck.value.dtype
  k, v = (x.astype(dtype).transpose(0, 2, 1, 3) for x in (k, v))  # [B, G, T, K]
  caches = [ck] if shared else [ck, cv]
  news = [k] if shared else [k, v]
  if int8:  # each cache as the attention reads it, then this call's entries as it stores them
    olds = [quantization.kv_dequantize(c.value, s.value, dtype) for c, s in zip(caches, scales)]
    pairs = [quantization.kv_quantize(x) for x in news]
    caches = [*caches, *scales]
    news = [p[0] for p in pairs] + [p[1] for p in pairs]
  else:
    olds = [c.value for c in caches]
  old_k, old_v = olds[0], olds[-1]
  if ring:  # the last min(T, S) of this call's positions, each in its slot
    kept = min(T, S)
    slots = jnp.mod(start + T - kept + jnp.arange(kept), S)
    for c, x in zip(caches, news):
      c.value = c.value.at[:, :, slots].set(x[:, :, T - kept :])
    # the position each slot held before this call: the latest p < start with p mod S = slot
    slot = jnp.arange(S, dtype=jnp.int32)
    key_positions = (start - 1 - jnp.mod(start - 1 - slot, S))[None]  # [1, S]; < 0: unwritten
    old_mask = (key_positions >= 0)[:, None, None, :]
  else:
    for c, x in zip(caches, news):
      c.value = jax.lax.dynamic_update_slice(c.value, x, (0, 0, start, 0))
    key_positions = index_positions(S)
    old_mask = (key_positions < start)[:, None, None, :]  # [1, 1, 1, S]
  ci.value = start + T
  new_mask = jnp.tril(jnp.ones((T, T), bool))[None, None]  # [1, 1, T, T]
  query_positions = index_positions(T, start)
  if window is not None:
    old_mask = old_mask & (query_positions[0, :, None] - key_positions[0, None] < window)
    new_mask = new_mask & (query_positions[0, :, None] - query_positions[0, None] < window)
  if chunk is not None:  # by the tokens' positions: slots shifted by each row's offset
    # (the last token's: a left-padded prompt's first positions are clamped at 0)
    shift = 0 if positions is None else positions[:, -1:] - (start + T - 1)  # [B, 1]
    q_chunk = ((query_positions + shift) // chunk)[:, None, :, None]  # [B or 1, 1, T, 1]
    old_mask = old_mask & (q_chunk == ((key_positions + shift) // chunk)[:, None, None, :])
    new_mask = new_mask & (q_chunk == ((query_positions + shift) // chunk)[:, None, None, :])
  prefix = getattr(pattern, "prefix", None)
  if prefix is not None:  # this call's keys within a row's prefix: seen by all its queries
    new_mask = new_mask | (query_positions[0, None, None, :] < prefix[:, None, None, None])
  if mask is not None:  # a caller's mask over the L positions, [B, 1, 1 or T, L]
    mask = jnp.broadcast_to(mask, mask.shape[:2] + (T, mask.shape[-1]))
    held = jnp.take(mask, jnp.maximum(key_positions[0], 0), axis=3) if ring else mask
    old_mask = old_mask & held
    new_mask = (new_mask & jax.lax.dynamic_slice_in_dim(mask, start, T, axis=3)) | jnp.eye(
        T, dtype=bool
    )
  old_bias = new_bias = None
  if bias is not None:
    old_bias = bias.block(query_positions, key_positions, G)
    new_bias = bias.block(query_positions, query_positions, G)
  if empty:
    return k, v, new_mask, None, None, None, new_bias, None
  return old_k, old_v, old_mask, k, v, new_mask, old_bias, new_bias
