"""Attention sinks (gpt-oss, model.attention_sinks): one learned logit per query head that joins
the denominator of every softmax that head takes, as a key that every query sees, whose value
is zero. A query's weights are then

    p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink_h))

so they sum to less than one, and a head can attend "nowhere" (output 0) rather than being
forced to spread its weight over the keys it may see. The sink is not scaled by 1/sqrt(K) and
no mask, window or soft-cap applies to it.

Each attention path takes it its own way: the written-out paths (einsum, the KV cache) add the
sink to their softmax (`softmax_with_sink`); the fused call (`jax.nn.dot_product_attention`)
gets one extra key of zeros and value zeros whose score bias is the sink (`with_sink_key`);
flash and the ring start their online softmax from it, running maximum = the sink and running
sum = 1 (`initial_state`), so that every block's rescaling carries it along; splash hands it
to the Pallas kernel, which does the same. The sinks' gradient is -sum exp(sink - lse) * D over
the batch and the queries (lse the log-sum-exp of every logit, the sink's included, D =
sum_k dout * out per query: `sink_grad`), what the blockwise backward passes add.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformers_jax.modules.common import dtype_of, normal


def sink_logits(module, cfg):
  """The attention module's learned sinks [H] (float32), or None without model.attention_sinks;
  initialised normal(model.init_std), as transformers initialises gpt-oss's."""
  if not cfg.attention_sinks:
    return None
  sinks = module.param(
      "sinks", normal(cfg.init_std, ("heads",)), (cfg.num_heads,), dtype_of(cfg.param_dtype)
  )
  return sinks.astype(jnp.float32)


def grouped(sinks, groups: int):
  """Sinks [H] as grouped-query attention lays the heads out, [G, H/G] (head h = g R + r)."""
  return None if sinks is None else sinks.astype(jnp.float32).reshape(groups, -1)


def softmax_with_sink(logits, sink=None):
  """softmax over the last axis of float32 `logits` with `sink` (broadcastable to logits[..., :1])
  in the denominator; without one, jax.nn.softmax."""
  if sink is None:
    return jax.nn.softmax(logits, axis=-1)
  top = jax.lax.stop_gradient(jnp.maximum(jnp.max(logits, axis=-1, keepdims=True), sink))
  e = jnp.exp(logits - top)
  return e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))


def with_sink_key(k, v, mask, causal: bool, bias, sinks, T: int):
  """The fused call's arguments with the sink as one more key (keys and values zero, score bias
  the sink, seen by every query): (k, v [B, S + 1, G, K], mask [.., T, S + 1], bias [.., H, 1
  or T, S + 1]). The causal order by index goes into the mask (the call's own would compare the
  extra key's index)."""
  B, S, G, K = k.shape
  H = sinks.shape[0]
  zero = jnp.zeros((B, 1, G, K), k.dtype)
  k, v = jnp.concatenate([k, zero], axis=1), jnp.concatenate([v, zero.astype(v.dtype)], axis=1)
  allowed = None if mask is None else mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  if causal:
    order = (jnp.arange(T)[:, None] >= jnp.arange(S)[None, :])[None, None]
    allowed = order if allowed is None else allowed & order
  if allowed is not None:
    allowed = jnp.broadcast_to(allowed, allowed.shape[:2] + (T, S))
    allowed = jnp.concatenate([allowed, jnp.ones(allowed.shape[:3] + (1,), bool)], axis=-1)
  sink = sinks.astype(jnp.float32)[None, :, None, None]
  if bias is None:
    bias = jnp.concatenate([jnp.zeros((1, H, 1, S), jnp.float32), sink], axis=-1)
  else:
    bias = bias.astype(jnp.float32)
    bias = jnp.concatenate([bias, jnp.broadcast_to(sink, bias.shape[:3] + (1,))], axis=-1)
  return k, v, allowed, bias


def initial_state(sinks, shape):
  """The online softmax's (running maximum, running sum) for queries of `shape` [B, G, R, n]
  before any key: (the sink, 1), or (the masked score, 0) without sinks."""
  if sinks is None:
    return jnp.full(shape, jnp.finfo(jnp.float32).min, jnp.float32), jnp.zeros(shape, jnp.float32)
  return jnp.broadcast_to(sinks[None, :, :, None], shape), jnp.ones(shape, jnp.float32)


def sink_grad(sinks, out, lse, dout):
  """d loss / d sinks [G, R] from the output out, its cotangent dout ([B, G, R, T, K]) and the
  log-sum-exp lse [B, G, R, T] of every logit, the sink's included (None without sinks)."""
  if sinks is None:
    return None
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(sinks[None, :, :, None] - lse) * delta, axis=(0, 3))
