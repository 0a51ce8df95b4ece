"""Beam search with the length penalty of Wu et al. (2016), as the 2017 Transformer used it
(beam 4, alpha 0.6): a hypothesis Y scores log P(Y) / lp(|Y|), lp(n) = ((5 + n) / 6) ** alpha.

Each step extends the k alive hypotheses of every row by every token, keeps the 2k best
extensions, moves those that end in a stop token to the row's k-best finished list (scored with
the length penalty) and keeps the k best others alive. The search ends when no alive hypothesis
can still beat the best finished one (the bound: log-probabilities only fall and lp only grows up
to lp(max_new_tokens)), or at `max_new_tokens`. A row with no finished hypothesis returns its
best alive one. All in one `lax.while_loop`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformers_jax.decode.sampling import is_stop

NEG_INF = -1e30  # finite, so that scores of dead hypotheses stay comparable without NaNs


def length_penalty(length, alpha: float):
  """lp(n) = ((5 + n) / 6) ** alpha; 1 when alpha == 0."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _take(x, idx):
  """x [B, n, ...], idx [B, m] -> x[b, idx[b, j]] : [B, m, ...]."""
  return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def beam_loop(feed, reorder, logits0, cache, batch: int, strategy):
  """Beam search of width k = strategy.beam_size over `batch` rows.

  logits0 [B * k, V] and `cache` hold each row's k (identical) copies, row b's beams at
  b * k ... b * k + k - 1. `feed(cache, tokens [B * k], i)` feeds generated token i of every
  beam and returns (logits [B * k, V], cache); `reorder(cache, rows [B * k])` gathers cache rows.
  Returns {'tokens' [B, M] (pad after the end), 'lengths' [B] (tokens before any stop token),
  'stopped' [B], 'scores' [B] (length-normalised log-probability)}.
  """
  s = strategy
  B, k, M = batch, s.beam_size, s.max_new_tokens
  V = logits0.shape[-1]
  stop = s.stop_tokens

  def advance(i, logits, alive_seq, alive_logp, fin_seq, fin_score, fin_len):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(B, k, V)
    cand = (alive_logp[:, :, None] + logp).reshape(B, k * V)
    scores, flat = jax.lax.top_k(cand, 2 * k)  # [B, 2k]
    parent, tok = flat // V, (flat % V).astype(jnp.int32)
    seqs = _take(alive_seq, parent).at[:, :, i].set(tok)  # [B, 2k, M]
    stopped = is_stop(tok, stop)
    # alive: the k best extensions that did not stop
    alive_logp, pick = jax.lax.top_k(jnp.where(stopped, NEG_INF, scores), k)
    alive_seq, parents, last = _take(seqs, pick), _take(parent, pick), _take(tok, pick)
    # finished: the k best of the old finished and the extensions that stopped now
    live = stopped & (scores > NEG_INF / 2)  # not the extension of a dead beam
    normalised = jnp.where(live, scores / length_penalty(i + 1, s.alpha), NEG_INF)
    pool = jnp.concatenate([fin_score, normalised], axis=1)
    fin_score, pick = jax.lax.top_k(pool, k)
    fin_seq = _take(jnp.concatenate([fin_seq, seqs], axis=1), pick)
    fin_len = _take(jnp.concatenate([fin_len, jnp.full((B, 2 * k), i + 1, jnp.int32)], 1), pick)
    rows = (jnp.arange(B)[:, None] * k + parents).reshape(B * k)
    return rows, last.reshape(B * k), alive_seq, alive_logp, fin_seq, fin_score, fin_len

  alive_seq = jnp.full((B, k, M), s.pad_id, jnp.int32)
  alive_logp = jnp.full((B, k), NEG_INF).at[:, 0].set(0.0)  # one live beam until step 0 forks
  fin_seq = jnp.full((B, k, M), s.pad_id, jnp.int32)
  fin_score = jnp.full((B, k), NEG_INF)
  fin_len = jnp.zeros((B, k), jnp.int32)
  _, last, *state = advance(0, logits0, alive_seq, alive_logp, fin_seq, fin_score, fin_len)
  # after step 0 every row's cache copies are still identical: no reorder needed
  best_possible = lambda logp: logp[:, 0] / length_penalty(M, s.alpha)  # noqa: E731

  def cond(carry):
    i, _, _, _, alive_logp, _, fin_score, _ = carry
    return (i < M) & ~jnp.all(fin_score[:, 0] > best_possible(alive_logp))

  def body(carry):
    i, cache, last, *state = carry
    logits, cache = feed(cache, last, i - 1)
    rows, last, *state = advance(i, logits, *state)
    return (i + 1, reorder(cache, rows), last, *state)

  carry = jax.lax.while_loop(cond, body, (jnp.int32(1), cache, last, *state))
  i, _, _, alive_seq, alive_logp, fin_seq, fin_score, fin_len = carry
  has_finished = fin_score[:, 0] > NEG_INF / 2
  tokens = jnp.where(has_finished[:, None], fin_seq[:, 0], alive_seq[:, 0])
  total = jnp.where(has_finished, fin_len[:, 0], i)
  scores = jnp.where(has_finished, fin_score[:, 0], alive_logp[:, 0] / length_penalty(i, s.alpha))
  lengths = total - has_finished.astype(jnp.int32)  # the stop token is not counted
  tokens = jnp.where(jnp.arange(M)[None, :] < total[:, None], tokens, s.pad_id)
  return {"tokens": tokens, "lengths": lengths, "stopped": has_finished, "scores": scores}
