"""The prefix language model (UL2's and T5's prefix LM) on the decoder: each row is cut at a
point, the tokens before it (the prefix) attend one another both ways, the rest causally, and
the loss is on the continuation only.

The cut is drawn per row, uniformly in [1, seq_len - 1], from (seed, step) (held-out batches:
from the seed alone, fixed). The prefix is data: the batch carries `prefix` [B], which the
model's attention pattern takes (modules/masks.py), so every attention implementation runs it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from transformers_jax.tasks.base import TaskData
from transformers_jax.tasks.lm import LanguageModeling


def prefix_lengths(seed: int, step: int, rows: int, seq_len: int) -> np.ndarray:
  """[rows] cut points, uniform in [1, seq_len - 1], a pure function of (seed, step)."""
  rng = np.random.default_rng([seed, step, 0x9E3779B9])
  return rng.integers(1, max(seq_len, 2), size=rows).astype(np.int32)


class PrefixLM(LanguageModeling):
  name = "prefix_lm"
  summary = "prefix LM (UL2, T5): bidirectional over a random prefix, next token after it"
  causal = True
  packs = ""  # packed documents would need a prefix per segment

  def batch_shapes(self, model_cfg, config):
    return {**super().batch_shapes(model_cfg, config), "prefix": ((config.batch_size,), np.int32)}

  def synthetic_batch(self, model_cfg, config, seed: int = 0) -> dict:
    batch = super().synthetic_batch(model_cfg, config, seed)
    batch["prefix"] = prefix_lengths(seed, 0, config.batch_size, config.seq_len)
    return batch

  def outputs(self, model, variables, batch, rngs, mutable):
    tokens, prefix = batch["tokens"], batch["prefix"]
    out, state = model.apply(
        variables, tokens[:, :-1], prefix_lengths=prefix, rngs=rngs, mutable=mutable
    )
    # the target at i is token i + 1: in the prefix (seen both ways) for i + 1 < prefix
    T = tokens.shape[1] - 1
    weights = (jnp.arange(T)[None, :] + 1 >= prefix[:, None]).astype(jnp.float32)
    unembedded = (out["hidden"], out["unembedding"])
    return (out["logits"], tokens[:, 1:], weights, unembedded), state

  def data(self, config, model_cfg, workdir):
    lm = super().data(config, model_cfg, workdir)
    B, T, seed = config.batch_size, config.seq_len, config.seed

    def with_prefix(batch, step, start=0, stop=None):
      cut = prefix_lengths(seed, step, B, T)[start:stop]
      return {**batch, "prefix": cut}

    evals = [with_prefix(b, 2**32 + i) for i, b in enumerate(lm.eval_batches)]  # not a step
    rows = None
    if lm.train_rows is not None:
      rows = lambda step, a, b: with_prefix(lm.train_rows(step, a, b), step, a, b)  # noqa: E731
    stream = None
    if lm.train_stream is not None:

      def stream(start, end):
        for step, batch in zip(range(start, end), lm.train_stream(start, end)):
          rows_here = len(next(iter(batch.values())))
          yield {**batch, "prefix": prefix_lengths(seed, step, rows_here, T)}

    weights = [b["prefix"] for b in evals]
    eval_bytes = None
    if lm.eval_bytes is not None and lm.tokenizer is not None:
      from transformers_jax import data as D

      lengths = np.asarray(D.token_byte_lengths(lm.tokenizer), np.int64)
      eval_bytes = float(
          sum(
              (lengths[b["tokens"][:, 1:]] * (np.arange(T)[None] + 1 >= cut[:, None])).sum()
              for b, cut in zip(evals, weights)
          )
      )
    return TaskData(
        lambda step: with_prefix(lm.train_batch(step), step),
        evals,
        lm.tokenizer,
        lm.summary,
        train_stream=stream,
        eval_bytes=eval_bytes,
        train_rows=rows,
        source=lm.source,
    )

  def sample(self, data, model_cfg, params, config):
    """The config's prompt, as a prefix (attended both ways), continued with the KV cache."""
    return self.continue_prompt(data, model_cfg, params, config, prompt_is_prefix=True)
