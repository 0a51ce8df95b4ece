"""Ring attention: the keys and values passed around the `context` mesh axis, never gathered.

Each of the N devices on the `context` axis holds T/N tokens of every sequence: its queries and
its own block of keys and values. In N steps every device scores its queries against the block
it holds, then `ppermute` passes the block (keys, values and the mask's per-key fields) to the
next device, so after N steps every query has met every key and every block is home again.

Each step is the blockwise ("flash") attention of modules/flash.py, which returns the block's
output and the log-sum-exp of each query's scores; the steps' results merge by their
log-sum-exp (the online softmax once more), so the result equals attention over all N T/N keys
while no device ever holds more than one block of keys or a block_q x block_kv tile of scores.

The backward pass is a second trip around the ring (a custom VJP). It keeps only what the
forward pass started from (the queries, the device's own block) and what it ended with (the
output and the log-sum-exp over all keys). Those final statistics give every block's exact
softmax probabilities exp(s - lse), so each step's gradients are flash's blockwise backward
for that block: the queries' gradient accumulates where it is, and the keys' and values'
gradients travel with their block, arriving home with it after N steps. Memory per device is
therefore linear in T/N, whatever N.

Runs inside the shard_map of `context.attend_over_context`, where the `context` axis is
manual. Causal masks compare the tokens' true positions (the zig-zag order of modules/context.py
balances the work), and a block pair that the positions mask wholly is skipped by flash's
`lax.cond`, so each device does about half of the score work of a full ring.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from transformers_jax.modules.flash import MASKED
from transformers_jax.modules.flash import BlockShape
from transformers_jax.modules.flash import blockwise_backward
from transformers_jax.modules.flash import blockwise_forward
from transformers_jax.modules.flash import prepare
from transformers_jax.modules.masks import is_causal
from transformers_jax.modules.sinks import grouped, sink_grad

KEY_FIELDS = (1, 2, 4)  # of flash's mask fields: key segments, key validity, key positions
# A log-sum-exp this low means the block had no key the query may attend (flash's MASKED scores)
EMPTY = MASKED / 2


def ring_attention(
    q,
    k,
    v,
    mask,
    causal: bool,
    axis: str,
    shards: int,
    bias=None,
    softcap=0.0,
    blocks=(512, 512),
    sinks=None,
):
  """softmax(q k^T / sqrt(K) + bias + mask) v over the keys of the `shards` devices on the mesh
  axis `axis` (manual here), in `blocks` of (queries, keys): q [B, T, H, K] this device's
  queries, k, v [B, T, G, K] its block of keys and values, `mask` an AttentionMask of this
  device's tokens (its key fields travel with the block), `bias` a ScoreBias
  (modules/positions.py) or None, `sinks` [H] attention sinks (modules/sinks.py: they enter the
  merged log-sum-exp once, before the first block) or None. Returns [B, T, H, K] in q's dtype."""
  causal = is_causal(mask, causal)
  if (causal or getattr(mask, "needs_positions", False)) and not mask.has_positions:
    raise ValueError(
        "ring attention masks causally (or by window, prefix or chunk) by the tokens' true "
        "positions: give the mask q_positions and kv_positions"
    )
  B, T, H, K = q.shape
  st, fields, qh, kh, vh = prepare(q, k, v, mask, causal, *blocks, softcap)
  ring = (axis, shards)
  out = _ring(st, ring, qh, kh, vh, fields, bias, grouped(sinks, k.shape[2]))[:, :, :, :T]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, K)


def _pass_on(tree, ring):
  """Every array of `tree` sent to the next device of the ring (axis name, size)."""
  axis, shards = ring
  pairs = [(j, (j + 1) % shards) for j in range(shards)]
  return jax.tree_util.tree_map(lambda x: jax.lax.ppermute(x, axis, pairs), tree)


def _with_keys(fields, key_fields):
  """Flash's mask fields with the key-side ones replaced by the visiting block's."""
  fields = list(fields)
  for index, value in zip(KEY_FIELDS, key_fields):
    fields[index] = value
  return tuple(fields)


def _forward(st: BlockShape, ring, qh, kh, vh, fields, bias, sinks=None):
  """(out [B, G, R, Tp, K] float32, lse [B, G, R, Tp]) over every block of the ring (its axis
  name, its size), starting from the sinks' logits [G, R] where there are sinks."""

  def step(carry, index):
    kh, vh, key_fields, out, lse = carry
    block_fields = _with_keys(fields, key_fields)
    block_out, block_lse = blockwise_forward(st, qh, kh, vh, block_fields, bias, jnp.float32)
    new_lse = jnp.logaddexp(lse, block_lse)
    merged = (
        out * jnp.exp(lse - new_lse)[..., None]
        + block_out * jnp.exp(block_lse - new_lse)[..., None]
    )
    # A query with no key to attend in any block so far: flash gives each block the masked keys'
    # average with the same (MASKED) log-sum-exp, so the merge would add them up; keep their
    # running mean instead, which is flash's answer over all keys (the blocks are equal-sized).
    empty = (lse <= EMPTY) & (block_lse <= EMPTY)
    mean = (out * index + block_out) / (index + 1)
    out = jnp.where(empty[..., None], mean, merged)
    kh, vh, key_fields = _pass_on((kh, vh, key_fields), ring)
    return (kh, vh, key_fields, out, new_lse), None

  key_fields = tuple(fields[i] for i in KEY_FIELDS)
  out = jnp.zeros(qh.shape, jnp.float32)
  lse = jnp.full(qh.shape[:-1], -jnp.inf, jnp.float32)
  if sinks is not None:  # a logit with value zero: the output stays 0, the log-sum-exp is it
    lse = jnp.broadcast_to(sinks[None, :, :, None], lse.shape)
  steps = jnp.arange(ring[1], dtype=jnp.float32)
  carry, _ = jax.lax.scan(step, (kh, vh, key_fields, out, lse), steps)
  return carry[3], carry[4]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ring(st: BlockShape, ring, qh, kh, vh, fields, bias, sinks):
  return _forward(st, ring, qh, kh, vh, fields, bias, sinks)[0].astype(qh.dtype)


def _ring_fwd(st, ring, qh, kh, vh, fields, bias, sinks):
  # out kept in float32 for the backward
  out, lse = _forward(st, ring, qh, kh, vh, fields, bias, sinks)
  return out.astype(qh.dtype), (qh, kh, vh, fields, bias, sinks, out, lse)


def _ring_bwd(st, ring, residuals, dout):
  qh, kh, vh, fields, bias, sinks, out, lse = residuals
  learned = bias is not None

  def step(carry, _):
    kh, vh, key_fields, dk, dv, dq, dw = carry
    block_fields = _with_keys(fields, key_fields)
    dqb, dkb, dvb, dbias = blockwise_backward(
        st, qh, kh, vh, block_fields, bias, out, lse, dout, jnp.float32
    )
    dw = dw + dbias.weights if learned else dw
    kh, vh, key_fields, dk, dv = _pass_on((kh, vh, key_fields, dk + dkb, dv + dvb), ring)
    return (kh, vh, key_fields, dk, dv, dq + dqb, dw), None

  key_fields = tuple(fields[i] for i in KEY_FIELDS)
  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)  # noqa: E731
  dw = zeros(bias.weights) if learned else jnp.zeros(())
  init = (kh, vh, key_fields, zeros(kh), zeros(vh), zeros(qh), dw)
  carry, _ = jax.lax.scan(step, init, None, length=ring[1])
  _, _, _, dk, dv, dq, dw = carry
  dbias = bias.replace(weights=dw.astype(bias.weights.dtype)) if learned else None
  no_grad = jax.tree_util.tree_map(lambda _: None, fields)
  dsinks = sink_grad(sinks, out, lse, dout)
  return dq.astype(qh.dtype), dk.astype(kh.dtype), dv.astype(vh.dtype), no_grad, dbias, dsinks


_ring.defvjp(_ring_fwd, _ring_bwd)
