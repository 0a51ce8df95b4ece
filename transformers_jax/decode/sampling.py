"""Choosing the next token from logits: greedy, or a seeded sample with temperature, top-k and
top-p (nucleus) filtering; and the decode loop that does it one token per step.

The loop is one `lax.while_loop` inside the caller's jit: no Python per token, no recompilation
per token; it ends when every row has emitted a stop token or `max_new_tokens` are out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def filter_logits(logits, top_k: int = 0, top_p: float = 1.0):
  """Set to -inf every logit outside the top k, then outside the smallest set of most probable
  tokens whose probabilities add up to top_p (the first token is always kept). [N, V] -> [N, V].
  `top_k=0` and `top_p=1` switch the filters off; ties at the boundary are all kept."""
  if top_k:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability mass strictly ahead of each token
    kept = before < top_p
    threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def select_tokens(logits, key, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0):
  """Next token per row from logits [N, V]: argmax when temperature == 0, else a sample from
  softmax(filtered logits / temperature). Settings are static (Python numbers)."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = filter_logits(logits.astype(jnp.float32) / temperature, top_k, top_p)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def is_stop(tokens, stop_tokens: tuple[int, ...]):
  if not stop_tokens:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(stop_tokens, jnp.int32))


def sample_loop(feed, logits0, cache, key, strategy):
  """Greedy or sampled decoding of `strategy.max_new_tokens` (M) tokens.

  logits0 [N, V] predict generated token 0 (from the prefill); `feed(cache, tokens [N], i)`
  feeds generated token i and returns (logits [N, V] for token i + 1, cache). Returns
  {'tokens' [N, M] (pad after a stop token), 'lengths' [N] (tokens before any stop token),
  'stopped' [N], and 'logits' [N, M, V] when strategy.return_logits}.
  """
  s = strategy
  N, V = logits0.shape
  M = s.max_new_tokens

  def choose(logits, i, done):
    tok = select_tokens(logits, jax.random.fold_in(key, i), s.temperature, s.top_k, s.top_p)
    tok = jnp.where(done, s.pad_id, tok)
    return tok, done | is_stop(tok, s.stop_tokens)

  tok0, done = choose(logits0, 0, jnp.zeros((N,), bool))
  tokens = jnp.full((N, M), s.pad_id, jnp.int32).at[:, 0].set(tok0)
  lengths = jnp.where(done, 0, 1)
  logits_out = jnp.zeros((N, M, V) if s.return_logits else (0,), jnp.float32)
  if s.return_logits:
    logits_out = logits_out.at[:, 0].set(logits0)

  def cond(carry):
    i, _, _, _, _, done, _ = carry
    return (i < M) & ~jnp.all(done)

  def body(carry):
    i, cache, tokens, prev, lengths, done, logits_out = carry
    logits, cache = feed(cache, prev, i - 1)
    tok, now_done = choose(logits, i, done)
    tokens = tokens.at[:, i].set(tok)
    lengths = lengths + (~now_done).astype(jnp.int32)
    if s.return_logits:
      logits_out = logits_out.at[:, i].set(logits)
    return i + 1, cache, tokens, tok, lengths, now_done, logits_out

  carry = (jnp.int32(1), cache, tokens, tok0, lengths, done, logits_out)
  _, _, tokens, _, lengths, done, logits_out = jax.lax.while_loop(cond, body, carry)
  out = {"tokens": tokens, "lengths": lengths, "stopped": done}
  if s.return_logits:
    out["logits"] = logits_out
  return out


def force_last_token(strategy, feed, logits0):
  """(feed, logits0) whose logits for the last new token allow only strategy.forced_eos."""
  last, V = strategy.max_new_tokens - 1, logits0.shape[-1]
  only = jnp.where(jnp.arange(V) == strategy.forced_eos, 0.0, -jnp.inf)

  def forced(logits, i):  # the logits that predict new token i
    return jnp.where(i == last, only.astype(logits.dtype), logits)

  def forced_feed(cache, tokens, i):
    logits, cache = feed(cache, tokens, i)
    return forced(logits, i + 1), cache

  return forced_feed, forced(logits0, 0)
