"""Blockwise ("flash") attention in plain JAX: memory linear in the sequence length, any backend.

The queries are cut into blocks of `block_q`, the keys into blocks of `block_kv`. For each query
block a loop over key blocks keeps a running float32 maximum and sum and weighted sum of values
(the online softmax: when a later block raises the maximum, what was accumulated is rescaled by
exp(m_old - m_new)), so no T x S score matrix is ever stored. A custom VJP saves only the output
and the log-sum-exp of each query's scores; the backward pass recomputes each block's scores
from q and k (an outer loop over key blocks, an inner loop over query blocks) and accumulates
dq, dk, dv in float32. Grouped key/value heads (GQA/MQA) are read in place: the R = H / G query
heads of a group share one key block, never repeated in memory.

Masks come as an AttentionMask (modules/masks.py) and are evaluated per block from its [B, T] /
[B, S] fields. T and S that are not multiples of the block sizes are padded internally (padded
keys are masked, padded queries dropped). Causal attention without positions (query i attends
key j <= i) skips the key blocks entirely above the diagonal statically, by the loop bounds: the
forward pass of query block i visits key blocks 0 .. (i + 1) * block_q / block_kv only, about
half of the work at long T. With positions (a permuted or split sequence), which blocks are
empty is known only from the data: each block pair is skipped with `lax.cond` when its smallest
key position exceeds its largest query position (over the whole batch), and masked otherwise.

A position scheme's score bias (modules/positions.ScoreBias: T5's relative bias, ALiBi) is
evaluated per block pair from the positions of its queries and keys (the mask's, or the
indices), so it never exists as a T x S array either; the backward pass takes the gradient of
a learned bias (T5's table) block by block from the same score gradients as dq and dk.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from transformers_jax.modules.common import soft_cap
from transformers_jax.modules.masks import AttentionMask, is_causal
from transformers_jax.modules.positions import index_positions
from transformers_jax.modules.sinks import grouped, initial_state, sink_grad

# The score of a masked pair: exp() of it minus any real maximum is exactly 0 in float32, and it
# stays finite, so a row with no key to attend averages its (masked) keys instead of making NaN.
MASKED = float(jnp.finfo(jnp.float32).min)


class BlockShape(NamedTuple):
  """What the kernel's shape depends on (hashable: a static argument of the custom VJP)."""

  block_q: int
  block_kv: int
  causal: bool
  by_position: bool  # causal order from the mask's positions rather than the indices
  scale: float
  softcap: float = 0.0  # scores s -> softcap tanh(s / softcap) before masking (0: off)


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _pad(x, axis: int, length: int, value=0):
  if x.shape[axis] == length:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, widths, constant_values=value)


def mask_fields(mask, B: int, T: int, S: int, Tp: int, Sp: int):
  """The mask's per-token fields padded to the block multiples Tp, Sp: (query segments, key
  segments, key validity, query positions, key positions, sliding window, prefix lengths [B],
  chunk), None where absent. Padded keys are invalid, so key validity exists whenever S is
  padded."""
  q_seg = kv_seg = valid = q_pos = kv_pos = window = prefix = chunk = None
  if isinstance(mask, AttentionMask):
    if mask.q_segments is not None:
      q_seg = _pad(mask.q_segments.astype(jnp.int32), 1, Tp)
      kv_seg = _pad(mask.key_segments.astype(jnp.int32), 1, Sp)
    if mask.kv_valid is not None:
      valid = _pad(mask.kv_valid.astype(bool), 1, Sp, False)
    if mask.has_positions:
      q_pos = _pad(mask.q_positions.astype(jnp.int32), 1, Tp)
      kv_pos = _pad(mask.kv_positions.astype(jnp.int32), 1, Sp, jnp.iinfo(jnp.int32).max)
    window, prefix, chunk = mask.window, mask.prefix, mask.chunk
  elif mask is not None:
    raise TypeError("flash attention takes an AttentionMask (modules/masks.py), not a dense mask")
  if valid is None and Sp > S:
    valid = jnp.arange(Sp)[None, :] < S
  return (q_seg, kv_seg, valid, q_pos, kv_pos, window, prefix, chunk)


def _block_mask(st: BlockShape, fields, i0, j0):
  """Boolean [B or 1, 1, 1, block_q, block_kv] for the block pair starting at query i0 and key
  j0 (True = may attend), or None when nothing masks it."""
  q_seg, kv_seg, valid, q_pos, kv_pos, window, prefix, chunk = fields
  bq, bk = st.block_q, st.block_kv
  out = None

  def both(a, b):
    return b if a is None else a & b

  if q_seg is not None:
    qs = lax.dynamic_slice_in_dim(q_seg, i0, bq, axis=1)
    ks = lax.dynamic_slice_in_dim(kv_seg, j0, bk, axis=1)
    out = both(out, qs[:, :, None] == ks[:, None, :])
  if valid is not None:
    out = both(out, lax.dynamic_slice_in_dim(valid, j0, bk, axis=1)[:, None, :])
  if st.causal:  # by position, or by index (the positions _bias_positions gives then)
    qp, kp = _bias_positions(st, fields, i0, j0)
    order = kp[:, None, :] <= qp[:, :, None]
    if prefix is not None:  # the prefix LM: every query sees its row's prefix
      order = order | (kp[:, None, :] < prefix[:, None, None])
    out = both(out, order)
  if window is not None:  # keys `window` or more positions back are masked
    qp, kp = _bias_positions(st, fields, i0, j0)
    out = both(out, qp[:, :, None] - kp[:, None, :] < window)
  if chunk is not None:  # Llama 4's chunks: the query's own chunk of positions only
    qp, kp = _bias_positions(st, fields, i0, j0)
    out = both(out, qp[:, :, None] // chunk == kp[:, None, :] // chunk)
  return None if out is None else out[:, None, None]


def _empty_by_position(st: BlockShape, fields, i0, j0):
  """Whether every pair of the block is causally masked by position (a traced bool): every key
  after every query, and none in a row's prefix."""
  _, _, _, q_pos, kv_pos, _, prefix, _ = fields
  qp = lax.dynamic_slice_in_dim(q_pos, i0, st.block_q, axis=1)
  kp = lax.dynamic_slice_in_dim(kv_pos, j0, st.block_kv, axis=1)
  empty = jnp.min(kp) > jnp.max(qp)
  return empty if prefix is None else empty & (jnp.min(kp) >= jnp.max(prefix))


def _kv_range(st: BlockShape, i0, nk: int, prefix=None):
  """Key blocks [0, hi) that query block i0 visits (all but those above the diagonal, unless a
  row's prefix reaches into them)."""
  if st.causal and not st.by_position:
    hi = (i0 + st.block_q - 1) // st.block_kv + 1
    if prefix is not None:
      hi = jnp.maximum(hi, (jnp.max(prefix) + st.block_kv - 1) // st.block_kv)
    return jnp.minimum(nk, hi)
  return nk


def _q_start(st: BlockShape, j0, prefix=None):
  """First query block that key block j0 reaches (causal, by index): every one for a key block
  in some row's prefix."""
  if st.causal and not st.by_position:
    first = j0 // st.block_q
    return first if prefix is None else jnp.where(j0 < jnp.max(prefix), 0, first)
  return 0


def _bias_positions(st: BlockShape, fields, i0, j0):
  """The positions the score bias reads for block pair (i0, j0): ([B or 1, block_q],
  [B or 1, block_kv]), the mask's positions where it has them, else the indices."""
  q_pos, kv_pos = fields[3], fields[4]
  if q_pos is None:
    return index_positions(st.block_q, i0), index_positions(st.block_kv, j0)
  return (
      lax.dynamic_slice_in_dim(q_pos, i0, st.block_q, axis=1),
      lax.dynamic_slice_in_dim(kv_pos, j0, st.block_kv, axis=1),
  )


def _scores(st: BlockShape, fields, qb, kb, i0, j0, bias=None, cap_slope: bool = False):
  """The block's scores q.k scale (+ bias, soft-capped), masked; with `cap_slope` also the
  soft-cap's derivative 1 - tanh^2 (1 without a cap), what the backward pass multiplies by."""
  s = jnp.einsum("bgrqk,bgsk->bgrqs", qb, kb, preferred_element_type=jnp.float32) * st.scale
  if bias is not None:
    s = s + bias.block(*_bias_positions(st, fields, i0, j0), qb.shape[1])
  s = soft_cap(s, st.softcap)
  slope = 1.0 - jnp.square(s / st.softcap) if st.softcap else 1.0
  m = _block_mask(st, fields, i0, j0)
  s = s if m is None else jnp.where(m, s, MASKED)
  return (s, slope) if cap_slope else s


def _skippable(st: BlockShape, fields, i0, j0, compute, carry):
  """`compute(carry)`, or `carry` unchanged where a block is empty by position or lies wholly
  outside a sliding window or the queries' chunks."""
  empty = None
  if st.causal and st.by_position:
    empty = _empty_by_position(st, fields, i0, j0)
  if fields[5] is not None:  # every key `window` or more positions behind every query
    qp, kp = _bias_positions(st, fields, i0, j0)
    outside = jnp.min(qp) - jnp.max(kp) >= fields[5]
    empty = outside if empty is None else empty | outside
  chunk = fields[7]
  if chunk is not None:
    qp, kp = _bias_positions(st, fields, i0, j0)
    apart = (jnp.max(kp) // chunk < jnp.min(qp) // chunk) | (
        jnp.min(kp) // chunk > jnp.max(qp) // chunk
    )
    empty = apart if empty is None else empty | apart
  if empty is not None:
    return lax.cond(empty, lambda c: c, compute, carry)
  return compute(carry)


def blockwise_forward(st: BlockShape, qh, kh, vh, fields, bias, out_dtype=None, sinks=None):
  """(out [B, G, R, Tp, K] in `out_dtype` (default q's), lse [B, G, R, Tp] float32) of the
  queries qh [B, G, R, Tp, K] over the keys and values kh, vh [B, G, Sp, K]; `sinks` [G, R]
  (modules/sinks.py) start each query's running maximum and sum, or None."""
  B, G, R, Tp, K = qh.shape
  Sp = kh.shape[2]
  bq, bk = st.block_q, st.block_kv
  nq, nk = Tp // bq, Sp // bk

  def query_block(i, carry):
    out, lse = carry
    i0 = i * bq
    qb = lax.dynamic_slice_in_dim(qh, i0, bq, axis=3)

    def key_block(j, state):
      j0 = j * bk

      def compute(state):
        m, total, acc = state
        kb = lax.dynamic_slice_in_dim(kh, j0, bk, axis=2)
        vb = lax.dynamic_slice_in_dim(vh, j0, bk, axis=2)
        s = _scores(st, fields, qb, kb, i0, j0, bias)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        rescale = jnp.exp(m - m_new)
        total = rescale * total + jnp.sum(p, axis=-1)
        pv = jnp.einsum(
            "bgrqs,bgsk->bgrqk", p.astype(vh.dtype), vb, preferred_element_type=jnp.float32
        )
        return m_new, total, rescale[..., None] * acc + pv

      return _skippable(st, fields, i0, j0, compute, state)

    init = (*initial_state(sinks, (B, G, R, bq)), jnp.zeros((B, G, R, bq, K), jnp.float32))
    m, total, acc = lax.fori_loop(0, _kv_range(st, i0, nk, fields[6]), key_block, init)
    total = jnp.maximum(total, jnp.finfo(jnp.float32).tiny)  # all blocks skipped: 0, not NaN
    ob = (acc / total[..., None]).astype(out.dtype)
    out = lax.dynamic_update_slice_in_dim(out, ob, i0, axis=3)
    lse = lax.dynamic_update_slice_in_dim(lse, m + jnp.log(total), i0, axis=3)
    return out, lse

  init = (jnp.zeros(qh.shape, out_dtype or qh.dtype), jnp.zeros((B, G, R, Tp), jnp.float32))
  return lax.fori_loop(0, nq, query_block, init)


def blockwise_backward(st: BlockShape, qh, kh, vh, fields, bias, out, lse, dout, grad_dtype=None):
  """(dq, dk, dv, d bias or None) in `grad_dtype` (default: the inputs' dtypes), recomputing each
  block's probabilities exp(s - lse) from the output and log-sum-exp the forward pass gave."""
  learned = bias is not None  # its weights' gradient (zero use for ALiBi's constant slopes)
  G = qh.shape[1]
  Tp = qh.shape[3]
  Sp = kh.shape[2]
  bq, bk = st.block_q, st.block_kv
  nq, nk = Tp // bq, Sp // bk
  # the softmax's backward needs sum_k dout * out per query: D [B, G, R, Tp]
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)

  def key_block(j, carry):
    dq, dk, dv, dw = carry
    j0 = j * bk
    kb = lax.dynamic_slice_in_dim(kh, j0, bk, axis=2)
    vb = lax.dynamic_slice_in_dim(vh, j0, bk, axis=2)

    def query_block(i, state):
      i0 = i * bq

      def compute(state):
        dq, dkb, dvb, dw = state
        qb = lax.dynamic_slice_in_dim(qh, i0, bq, axis=3)
        dob = lax.dynamic_slice_in_dim(dout, i0, bq, axis=3)
        s, slope = _scores(st, fields, qb, kb, i0, j0, bias, cap_slope=True)
        p = jnp.exp(s - lax.dynamic_slice_in_dim(lse, i0, bq, axis=3)[..., None])
        dvb = dvb + jnp.einsum(
            "bgrqs,bgrqk->bgsk", p.astype(dob.dtype), dob, preferred_element_type=jnp.float32
        )
        dp = jnp.einsum("bgrqk,bgsk->bgrqs", dob, vb, preferred_element_type=jnp.float32)
        ds = p * (dp - lax.dynamic_slice_in_dim(delta, i0, bq, axis=3)[..., None]) * slope
        if learned:  # d loss / d bias is the score gradient itself, before the 1/sqrt(K) scale
          positions = _bias_positions(st, fields, i0, j0)
          b, pullback = jax.vjp(
              lambda w: bias.replace(weights=w).block(*positions, G), bias.weights
          )
          dw = dw + pullback(ds if b.shape[0] == ds.shape[0] else ds.sum(0, keepdims=True))[0]
        ds = (ds * st.scale).astype(qh.dtype)
        dqb = jnp.einsum("bgrqs,bgsk->bgrqk", ds, kb, preferred_element_type=jnp.float32)
        dq = lax.dynamic_update_slice_in_dim(
            dq, lax.dynamic_slice_in_dim(dq, i0, bq, axis=3) + dqb, i0, axis=3
        )
        dkb = dkb + jnp.einsum("bgrqs,bgrqk->bgsk", ds, qb, preferred_element_type=jnp.float32)
        return dq, dkb, dvb, dw

      return _skippable(st, fields, i0, j0, compute, state)

    zeros = jnp.zeros(kb.shape, jnp.float32)
    first = _q_start(st, j0, fields[6])
    dq, dkb, dvb, dw = lax.fori_loop(first, nq, query_block, (dq, zeros, zeros, dw))
    dk = lax.dynamic_update_slice_in_dim(dk, dkb.astype(dk.dtype), j0, axis=2)
    dv = lax.dynamic_update_slice_in_dim(dv, dvb.astype(dv.dtype), j0, axis=2)
    return dq, dk, dv, dw

  dw = jnp.zeros(bias.weights.shape, jnp.float32) if learned else jnp.zeros(())
  init = (
      jnp.zeros(qh.shape, jnp.float32),
      jnp.zeros(kh.shape, grad_dtype or kh.dtype),
      jnp.zeros(vh.shape, grad_dtype or vh.dtype),
      dw,
  )
  dq, dk, dv, dw = lax.fori_loop(0, nk, key_block, init)
  dbias = bias.replace(weights=dw.astype(bias.weights.dtype)) if learned else None
  return dq.astype(grad_dtype or qh.dtype), dk, dv, dbias


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st: BlockShape, qh, kh, vh, fields, bias, sinks):
  return blockwise_forward(st, qh, kh, vh, fields, bias, sinks=sinks)[0]


def _flash_fwd(st, qh, kh, vh, fields, bias, sinks):
  out, lse = blockwise_forward(st, qh, kh, vh, fields, bias, sinks=sinks)
  return out, (qh, kh, vh, fields, bias, sinks, out, lse)


def _flash_bwd(st, residuals, dout):
  qh, kh, vh, fields, bias, sinks, out, lse = residuals
  dq, dk, dv, dbias = blockwise_backward(st, qh, kh, vh, fields, bias, out, lse, dout)
  dsinks = sink_grad(sinks, out, lse, dout)
  return dq, dk, dv, jax.tree_util.tree_map(lambda _: None, fields), dbias, dsinks


_flash.defvjp(_flash_fwd, _flash_bwd)


def prepare(q, k, v, mask, causal: bool, block_q: int, block_kv: int, softcap: float = 0.0):
  """(BlockShape, mask fields, qh [B, G, R, Tp, K], kh [B, G, Sp, K], vh or None) for q
  [B, T, H, K], k, v [B, S, G, K]: the block sizes clipped to the lengths (rounded to 8), the
  lengths padded to multiples of them, the heads grouped as the blockwise loops read them."""
  B, T, H, K = q.shape
  S, G = k.shape[1], k.shape[2]
  bq = min(block_q, _round_up(T, 8))
  bk = min(block_kv, _round_up(S, 8))
  Tp, Sp = _round_up(T, bq), _round_up(S, bk)
  by_position = isinstance(mask, AttentionMask) and mask.has_positions
  causal = is_causal(mask, causal)
  st = BlockShape(bq, bk, causal, bool(by_position), 1.0 / float(K) ** 0.5, float(softcap))
  qh = _pad(q.reshape(B, T, G, H // G, K).transpose(0, 2, 3, 1, 4), 3, Tp)
  kh = _pad(k.transpose(0, 2, 1, 3), 2, Sp)
  vh = None if v is None else _pad(v.transpose(0, 2, 1, 3), 2, Sp)
  return st, mask_fields(mask, B, T, S, Tp, Sp), qh, kh, vh


def flash_attention(
    q, k, v, mask=None, causal=False, block_q=512, block_kv=512, bias=None, softcap=0.0, sinks=None
):
  """softmax(q k^T / sqrt(K) + bias + mask) v blockwise; q [B, T, H, K], k v [B, S, G, K] ->
  [B, T, H, K].

  `mask`: an AttentionMask (whose pattern decides: causal, prefix, window, chunks) or None;
  `causal`, for a mask of None: key j > query i masked; `bias`: a ScoreBias (modules/positions.py) or
  None; `softcap`: Gemma 2's soft-capping of the scores (0: none); `sinks`: [H] attention sinks
  (modules/sinks.py) or None."""
  B, T, H, K = q.shape
  st, fields, qh, kh, vh = prepare(q, k, v, mask, causal, block_q, block_kv, softcap)
  out = _flash(st, qh, kh, vh, fields, bias, grouped(sinks, k.shape[2]))[:, :, :, :T]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, K)


def blockwise_max_logit(
    q, k, mask=None, causal: bool = False, block_q=512, block_kv=512, bias=None, softcap=0.0
):
  """The largest score q.k / sqrt(K) + bias over the pairs the mask allows (float32), computed
  block by block as `flash_attention` visits them: no T x S array."""
  T = q.shape[1]
  st, fields, qh, kh, _ = prepare(q, k, None, mask, causal, block_q, block_kv, softcap)
  bq, bk, Tp, Sp = st.block_q, st.block_kv, qh.shape[3], kh.shape[2]
  if Tp > T:  # padded queries must not count: mark them with a segment no key has
    q_seg = fields[0] if fields[0] is not None else jnp.zeros((1, Tp), jnp.int32)
    kv_seg = fields[1] if fields[1] is not None else jnp.zeros((1, Sp), jnp.int32)
    q_seg = jnp.where(jnp.arange(Tp) < T, q_seg, jnp.iinfo(jnp.int32).min)
    kv_seg = jnp.where(kv_seg == jnp.iinfo(jnp.int32).min, 0, kv_seg)
    fields = (q_seg, kv_seg) + tuple(fields[2:])

  def query_block(i, best):
    i0 = i * bq
    qb = lax.dynamic_slice_in_dim(qh, i0, bq, axis=3)

    def key_block(j, best):
      j0 = j * bk

      def compute(best):
        kb = lax.dynamic_slice_in_dim(kh, j0, bk, axis=2)
        s = _scores(st, fields, qb, kb, i0, j0, bias)
        return jnp.maximum(best, jnp.max(jnp.where(s == MASKED, -jnp.inf, s)))

      return _skippable(st, fields, i0, j0, compute, best)

    return lax.fori_loop(0, _kv_range(st, i0, Sp // bk, fields[6]), key_block, best)

  return lax.fori_loop(0, Tp // bq, query_block, jnp.float32(-jnp.inf))
