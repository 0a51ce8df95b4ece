"""Greedy and temperature/top-k sampling for decoder-only models; greedy translation for the
encoder-decoder. The whole loop is one `lax.scan` under jit (no Python loop per token)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformers_jax.models import as_model_config, build_model


def pick(logits, key, temperature: float, top_k: int):
  """Next token from logits [B, V]: argmax if temperature == 0, else a (top-k) sample."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if top_k:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def generate(cfg, params, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
             top_k: int = 0, seed: int = 0) -> list[int]:
  """Continue one prompt; stops at model.max_len. Returns the new token ids."""
  cfg = as_model_config(cfg)
  if not prompt:
    raise ValueError("the prompt is empty: give at least one token")
  if len(prompt) >= cfg.max_len:
    raise ValueError(f"the prompt has {len(prompt)} tokens, model.max_len={cfg.max_len}: "
                     "shorten the prompt")
  bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
  if bad:
    raise ValueError(f"prompt id {bad[0]} is outside the vocabulary [0, {cfg.vocab_size})")
  new = min(max_new_tokens, cfg.max_len - len(prompt))
  model = build_model(cfg, decode=True)
  cache = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))["cache"]

  @jax.jit
  def run(params, cache, tokens, key):
    out, v = model.apply({"params": params, "cache": cache}, tokens, mutable=["cache"])

    def step(carry, k):
      cache, logits = carry
      tok = pick(logits, k, temperature, top_k)
      out, v = model.apply({"params": params, "cache": cache}, tok[:, None], mutable=["cache"])
      return (v["cache"], out["logits"][:, -1]), tok

    _, toks = jax.lax.scan(step, (v["cache"], out["logits"][:, -1]), jax.random.split(key, new))
    return toks[:, 0]

  out = run(params, cache, jnp.asarray([prompt], jnp.int32), jax.random.PRNGKey(seed))
  return [int(t) for t in out]


def translate(cfg, params, src, src_mask, bos_id: int, eos_id: int, max_len: int):
  """Greedy decoding for the encoder-decoder: src [B, S] -> ids [B, max_len] (after bos)."""
  cfg = as_model_config(cfg)
  model = build_model(cfg, decode=True)
  B = src.shape[0]
  cache = model.init(jax.random.PRNGKey(0), src, jnp.zeros((B, 1), jnp.int32), src_mask)["cache"]
  steps = min(max_len, cfg.max_len)

  @jax.jit
  def run(params, cache, src, src_mask):
    encoded = model.apply({"params": params}, src, src_mask, method="encode")

    def step(carry, _):
      cache, tok, done = carry
      out, v = model.apply({"params": params, "cache": cache}, encoded, tok[:, None], src_mask,
                           method="decode_logits", mutable=["cache"])
      nxt = jnp.argmax(out["logits"][:, -1], axis=-1).astype(jnp.int32)
      nxt = jnp.where(done, eos_id, nxt)
      return (v["cache"], nxt, done | (nxt == eos_id)), nxt

    start = jnp.full((B,), bos_id, jnp.int32)
    _, toks = jax.lax.scan(step, (cache, start, jnp.zeros((B,), bool)), None, length=steps)
    return toks.T

  return run(params, cache, src, src_mask)
