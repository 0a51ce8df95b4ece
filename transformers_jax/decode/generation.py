"""Generation for the decoder-only and encoder-decoder families: input checks, the prefill, the
cached one-token step, and one jit-compiled program per (model, strategy).

Decoder-only batches of prompts of different lengths are left-padded to the longest (P tokens):
every row ends at slot P - 1, so one cache index serves all rows, while each row has its own
positions (slot - padding, for learned, sinusoidal and RoPE positions alike) and a mask hiding
its padding slots. The cache has P + M - 1 slots for M new tokens (the last token is never fed).

Encoder-decoder: the encoder runs once, on the B sources; the decoder starts from bos, its
cross-attention keys/values are projected once by the first step and cached with its
self-attention keys/values. Beam search runs the prefill on B rows and then copies each row's
cache k times.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformers_jax.decode.beam import beam_loop
from transformers_jax.decode.cache import gather_rows, init_cache, repeat_rows
from transformers_jax.decode.sampling import force_last_token, sample_loop
from transformers_jax.models import as_model_config, build_model


@dataclasses.dataclass(frozen=True)
class Strategy:
  """How to pick tokens; static (each distinct strategy compiles its own program)."""

  max_new_tokens: int  # M: tokens generated per row, stop tokens included
  temperature: float = 0.0  # 0 = greedy (argmax)
  top_k: int = 0  # sample among the k most probable tokens; 0 = all
  top_p: float = 1.0  # sample among the smallest set holding this much probability; 1 = all
  beam_size: int = 0  # k >= 1: beam search of width k (sampling settings unused); 0 = off
  alpha: float = 0.6  # beam search length penalty exponent (Wu et al. 2016); 0 = none
  stop_tokens: tuple[int, ...] = ()  # a row ends after emitting one of these
  pad_id: int = 0  # fills a row after it has ended
  return_logits: bool = False  # greedy/sampling: also return the logits of every step
  prompt_is_prefix: bool = False  # a prefix LM's prompt: its tokens attend each other
  # the last of max_new_tokens is this token in every row still going (transformers'
  # forced_eos_token_id: Marian's and BART's configs set it); -1 = none
  forced_eos: int = -1

  def check(self, vocab_size: int) -> None:
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be at least 1")
    if not self.temperature >= 0 or math.isinf(self.temperature):  # NaN fails every comparison
      raise ValueError(
          f"temperature={self.temperature}: must be a finite number >= 0 " "(0 = greedy)"
      )
    if not 0 <= self.top_k <= vocab_size:
      raise ValueError(f"top_k={self.top_k}: must be in [0, vocab_size={vocab_size}] (0 = off)")
    if not 0 < self.top_p <= 1:  # also refuses NaN
      raise ValueError(f"top_p={self.top_p}: must be in (0, 1] (1 = off)")
    if self.beam_size < 0:
      raise ValueError(f"beam_size={self.beam_size}: must be >= 0 (0 = no beam search)")
    if self.beam_size and 2 * self.beam_size > self.beam_size * vocab_size:
      raise ValueError(f"beam_size={self.beam_size} needs a vocabulary of at least 2 tokens")
    if not self.alpha >= 0 or math.isinf(self.alpha):
      raise ValueError(
          f"alpha={self.alpha}: the length penalty exponent must be a finite " "number >= 0"
      )
    if self.beam_size and self.return_logits:
      raise ValueError("return_logits is for greedy decoding and sampling, not beam search")
    for t in self.stop_tokens:
      if not 0 <= t < vocab_size:
        raise ValueError(f"stop token {t} is outside the vocabulary [0, {vocab_size})")
    if not -1 <= self.forced_eos < vocab_size:
      raise ValueError(f"forced_eos_id={self.forced_eos}: outside the vocabulary [0, {vocab_size})")


@dataclasses.dataclass
class Generation:
  """What `generate` and `translate` return, one row per prompt or source (numpy)."""

  tokens: np.ndarray  # [B, M] generated ids; a stop token ends a row, pad_id follows
  lengths: np.ndarray  # [B] generated tokens before any stop token
  stopped: np.ndarray  # [B] whether the row ended with a stop token
  max_new_tokens: int  # M, after clamping to the model's positions
  scores: np.ndarray | None = None  # beam search: log P / length penalty of each result
  logits: np.ndarray | None = None  # [B, M, V] with return_logits

  def ids(self) -> list[list[int]]:
    """Each row's generated ids, without the stop token and the padding."""
    return [[int(t) for t in row[:n]] for row, n in zip(self.tokens, self.lengths)]


# ----------------------------------------------------------------------------- programs
def _search(strategy, feed, logits0, cache, batch, key):
  """Beam search or sampling from the prefill's logits0 [B, V] and cache (B rows)."""
  if strategy.forced_eos >= 0:
    feed, logits0 = force_last_token(strategy, feed, logits0)
  if not strategy.beam_size:
    return sample_loop(feed, logits0, cache, key, strategy)
  k = strategy.beam_size
  return beam_loop(
      feed, gather_rows, jnp.repeat(logits0, k, axis=0), repeat_rows(cache, k), batch, strategy
  )


def _lm_program(cfg, strategy):
  """(params, prompts [B, P] left-padded, lengths [B], key) -> outputs of the search."""
  model = build_model(cfg, decode=True)
  M = strategy.max_new_tokens
  k = max(strategy.beam_size, 1)

  def run(params, prompts, lengths, key):
    B, P = prompts.shape
    L = P + M - 1
    padding = P - lengths
    valid = (jnp.arange(L)[None, :] >= padding[:, None]).astype(jnp.int32)  # [B, L]
    positions = jnp.maximum(jnp.arange(P)[None, :] - padding[:, None], 0)
    dummy = jnp.zeros((B, L), jnp.int32)
    cache = init_cache(model, dummy, dummy, dummy)
    out, state = model.apply(
        {"params": params, "cache": cache},
        prompts,
        valid,
        positions,
        last_logits_only=True,
        # the cache compares slots: the prompt call's P slots are the prefix (padding masked)
        prefix_lengths=jnp.full_like(lengths, P) if strategy.prompt_is_prefix else None,
        mutable=["cache"],
    )
    if strategy.beam_size:  # every beam of a row shares its mask and positions
      valid, lengths = jnp.repeat(valid, k, axis=0), jnp.repeat(lengths, k, axis=0)

    def feed(cache, tokens, i):
      out, state = model.apply(
          {"params": params, "cache": cache},
          tokens[:, None],
          valid,
          (lengths + i)[:, None],
          mutable=["cache"],
      )
      return out["logits"][:, -1], state["cache"]

    return _search(strategy, feed, out["logits"][:, -1], state["cache"], B, key)

  return run


def _seq2seq_program(cfg, strategy, bos_id: int):
  """(params, src [B, S], src_mask [B, S], key) -> outputs of the search."""
  model = build_model(cfg, decode=True)
  M = strategy.max_new_tokens
  k = max(strategy.beam_size, 1)

  def run(params, src, src_mask, key):
    B, S = src.shape
    encoded = model.apply({"params": params}, src, src_mask, method="encode")
    cache = init_cache(model, jnp.zeros((B, S), jnp.int32), jnp.zeros((B, M), jnp.int32))
    bos = jnp.full((B, 1), bos_id, jnp.int32)
    out, state = model.apply(
        {"params": params, "cache": cache},
        encoded,
        bos,
        src_mask,
        method="decode_logits",
        mutable=["cache"],
    )
    if strategy.beam_size:
      encoded, src_mask = jnp.repeat(encoded, k, axis=0), jnp.repeat(src_mask, k, axis=0)

    def feed(cache, tokens, i):
      # `encoded` only routes the blocks through cross-attention: its keys/values are cached
      out, state = model.apply(
          {"params": params, "cache": cache},
          encoded,
          tokens[:, None],
          src_mask,
          method="decode_logits",
          mutable=["cache"],
      )
      return out["logits"][:, -1], state["cache"]

    return _search(strategy, feed, out["logits"][:, -1], state["cache"], B, key)

  return run


@functools.lru_cache(maxsize=64)
def _compiled(cfg, strategy, bos_id):
  program = (
      _lm_program(cfg, strategy)
      if cfg.family == "decoder"
      else _seq2seq_program(cfg, strategy, bos_id)
  )
  return jax.jit(program)


def shard_params(cfg, params, mesh, rules=None):
  """Place parameters on `mesh` as the logical-axis rules say (default parallel.rules(), the
  training layout)."""
  from transformers_jax.models import param_shardings

  return jax.device_put(params, param_shardings(as_model_config(cfg), mesh, rules))


def _place(mesh, args, rows: int):
  """Inputs split over the mesh's data-parallel axes when the rows divide, else replicated; jit
  propagates that and the parameters' shardings through the whole decode."""
  if mesh is None:
    return args
  from jax.sharding import NamedSharding, PartitionSpec
  from transformers_jax.machine import parallel

  shards = int(np.prod([mesh.shape[a] for a in parallel.BATCH_AXES]))
  split = NamedSharding(mesh, PartitionSpec(parallel.BATCH_AXES))
  whole = NamedSharding(mesh, PartitionSpec())
  return tuple(
      jax.device_put(a, split if rows % shards == 0 and np.ndim(a) else whole) for a in args
  )


def _run(cfg, strategy, bos_id, mesh, params, args):
  fn = _compiled(cfg, strategy, bos_id)
  out = jax.device_get(fn(params, *_place(mesh, args[:-1], len(args[0])), args[-1]))
  return Generation(
      tokens=np.asarray(out["tokens"]),
      lengths=np.asarray(out["lengths"]),
      stopped=np.asarray(out["stopped"]),
      max_new_tokens=strategy.max_new_tokens,
      scores=None if "scores" not in out else np.asarray(out["scores"]),
      logits=None if "logits" not in out else np.asarray(out["logits"]),
  )


# ----------------------------------------------------------------------------- inputs
def _check_ids(rows, what: str, vocab_size: int, max_len: int) -> list[list[int]]:
  if (
      isinstance(rows, np.ndarray)
      and rows.ndim == 1
      or (len(rows) and isinstance(rows[0], (int, np.integer)))
  ):
    raise ValueError(f"pass a list of {what}s (each a list of token ids), not one flat list")
  rows = [[int(t) for t in r] for r in rows]
  if not rows:
    raise ValueError(f"no {what}s given: pass at least one")
  for i, r in enumerate(rows):
    name = f"{what} {i + 1}" if len(rows) > 1 else what
    if not r:
      raise ValueError(f"{name} is empty: give at least one token")
    if len(r) > max_len:
      raise ValueError(
          f"{name} has {len(r)} tokens but model.max_len={max_len}: shorten it to "
          f"at most {max_len} tokens"
      )
    bad = [t for t in r if not 0 <= t < vocab_size]
    if bad:
      raise ValueError(
          f"{name} holds token id {bad[0]}, outside the vocabulary " f"[0, {vocab_size})"
      )
  return rows


def _family(cfg, family: str, fn: str, other: str) -> None:
  if cfg.family != family:
    hint = (
        f"use {other}"
        if cfg.family in ("decoder", "encoder_decoder")
        else "only decoder and encoder_decoder models generate text"
    )
    raise ValueError(f"{fn} needs a model.family={family} model, not {cfg.family}: {hint}")


def generate(
    cfg,
    params,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_tokens: Sequence[int] = (),
    beam_size: int = 0,
    alpha: float = 0.6,
    pad_id: int = 0,
    return_logits: bool = False,
    mesh=None,
    prompt_is_prefix: bool = False,
    forced_eos_id: int | None = None,
) -> Generation:
  """Continue each prompt (a list of token ids) of a decoder-only model.

  Greedy when temperature == 0, else a sample (top_k / top_p filtered) from key `seed`;
  beam search of width `beam_size` when it is >= 1. A row ends after a token of `stop_tokens`
  or `max_new_tokens` tokens, which is lowered to what the positions allow (the longest prompt
  plus the new tokens but the last fit in model.max_len). With a `mesh`, the prompts are split
  over its data axes and `params` keep their placement (`shard_params` puts them there).
  `prompt_is_prefix`: each prompt is a prefix LM's prefix (tasks/prefix_lm.py), its tokens
  attending one another both ways; the new tokens attend causally. `forced_eos_id`: the last
  of the max_new_tokens is this token in every row that has not stopped (transformers'
  forced_eos_token_id).
  """
  cfg = as_model_config(cfg)
  _family(cfg, "decoder", "generate", "translate")
  rows = _check_ids(prompts, "prompt", cfg.vocab_size, cfg.max_len)
  P = max(len(r) for r in rows)
  strategy = Strategy(
      min(max_new_tokens, cfg.max_len - P + 1) if max_new_tokens >= 1 else max_new_tokens,
      temperature,
      top_k,
      top_p,
      beam_size,
      alpha,
      tuple(int(t) for t in stop_tokens),
      pad_id,
      return_logits,
      prompt_is_prefix,
      -1 if forced_eos_id is None else int(forced_eos_id),
  )
  strategy.check(cfg.vocab_size)
  tokens = np.full((len(rows), P), pad_id, np.int32)
  for i, r in enumerate(rows):
    tokens[i, P - len(r) :] = r
  lengths = np.array([len(r) for r in rows], np.int32)
  key = jax.random.PRNGKey(seed)
  return _run(cfg, strategy, None, mesh, params, (tokens, lengths, key))


def translate(
    cfg,
    params,
    sources: Sequence[Sequence[int]],
    bos_id: int,
    eos_id: int,
    max_new_tokens: int | None = None,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    pad_id: int | None = None,
    source_len: int | None = None,
    return_logits: bool = False,
    mesh=None,
    forced_eos_id: int | None = None,
) -> Generation:
  """Translate each source (a list of token ids) with an encoder-decoder model.

  Beam search (the 2017 paper's beam 4, alpha 0.6) by default; `beam_size=0` for greedy or
  sampling. The target starts with `bos_id` and ends at `eos_id`, or after `max_new_tokens`
  (default: the longest source + 50, as in the paper), at most model.max_len. Sources are
  right-padded to `source_len` (default: the longest; pass a fixed length to compile once for
  batches of varying lengths). `forced_eos_id`: the last of the max_new_tokens is this token in
  every row not ended (transformers' forced_eos_token_id, which Marian's and BART's set).
  """
  cfg = as_model_config(cfg)
  _family(cfg, "encoder_decoder", "translate", "generate")
  rows = _check_ids(sources, "source", cfg.vocab_size, cfg.max_len)
  for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
    if value is None or not 0 <= value < cfg.vocab_size:
      raise ValueError(
          f"{name}={value} is not a token of the vocabulary [0, {cfg.vocab_size}): "
          "use the tokenizer's special ids"
      )
  S = max(len(r) for r in rows)
  if source_len is not None:
    if source_len < S or source_len > cfg.max_len:
      raise ValueError(
          f"source_len={source_len} must hold the longest source ({S} tokens) and "
          f"be at most model.max_len={cfg.max_len}"
      )
    S = source_len
  if max_new_tokens is None:
    max_new_tokens = max(len(r) for r in rows) + 50
  pad = eos_id if pad_id is None else pad_id
  strategy = Strategy(
      min(max_new_tokens, cfg.max_len) if max_new_tokens >= 1 else max_new_tokens,
      temperature,
      top_k,
      top_p,
      beam_size,
      alpha,
      (int(eos_id),),
      pad,
      return_logits,
      forced_eos=-1 if forced_eos_id is None else int(forced_eos_id),
  )
  strategy.check(cfg.vocab_size)
  src = np.full((len(rows), S), pad, np.int32)
  for i, r in enumerate(rows):
    src[i, : len(r)] = r
  src_mask = (np.arange(S)[None, :] < np.array([len(r) for r in rows])[:, None]).astype(np.int32)
  key = jax.random.PRNGKey(seed)
  return _run(cfg, strategy, int(bos_id), mesh, params, (src, src_mask, key))
