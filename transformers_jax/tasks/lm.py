"""Next-token prediction (decoder-only): text in, the same text one token later out."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from transformers_jax import data as D
from transformers_jax.data.pipeline import RowLayout
from transformers_jax.tasks.base import Task, TaskData
from transformers_jax.tasks.text_data import token_arrays


class NextTokenRows(RowLayout):
  """Streamed rows of next-token prediction: tokens [rows, seq_len + 1]; packed, also
  segment_ids, positions and weights [rows, seq_len] (no target across documents)."""

  overlap = 1

  def window(self, seq_len):
    return seq_len + 1

  def finish(self, tokens, segments, positions, seed, step, rows):
    out = {"tokens": tokens}
    if segments is not None:
      out["segment_ids"] = segments[:, :-1]
      out["positions"] = positions[:, :-1]
      out["weights"] = ((segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)).astype(
          np.float32
      )
    return out

  def target_bytes(self, batch, byte_lengths):
    return float((byte_lengths[batch["tokens"][:, 1:]] * batch.get("weights", 1.0)).sum())


class LanguageModeling(Task):
  name = "lm"
  summary = "next-token prediction on text (decoder)"
  families = ("decoder",)
  bundled_data = "corpus"
  language_model = True
  causal = True
  packs = "documents"
  chunked_loss = True

  def batch_shapes(self, model_cfg, config):
    B, T = config.batch_size, config.seq_len
    shapes = {"tokens": ((B, T + 1), np.int32)}
    if config.data.packing:  # documents packed into rows (see data/pipeline.py)
      shapes.update(
          segment_ids=((B, T), np.int32), positions=((B, T), np.int32), weights=((B, T), np.float32)
      )
    return shapes

  def outputs(self, model, variables, batch, rngs, mutable):
    tokens = batch["tokens"]
    out, state = model.apply(
        variables,
        tokens[:, :-1],
        positions=batch.get("positions"),
        segment_ids=batch.get("segment_ids"),
        rngs=rngs,
        mutable=mutable,
    )
    weights = batch.get("weights", jnp.ones(tokens[:, 1:].shape, jnp.float32))
    unembedded = (out["hidden"], out["unembedding"])  # for a loss over chunks of tokens
    return (out["logits"], tokens[:, 1:], weights, unembedded), state

  def data(self, config, model_cfg, workdir):
    if config.data.path or config.data.get("mixture", ""):  # streamed: stream_data.py
      from transformers_jax.tasks.stream_data import streamed_text_data

      return streamed_text_data(config, model_cfg, workdir, lambda tok: NextTokenRows(), False)
    tok, train, val, summary = token_arrays(config, model_cfg, workdir, specials=False)
    train_b, val_b = D.LMBatches(train), D.LMBatches(val)
    B, T, seed = config.batch_size, config.seq_len, config.seed
    evals = [{"tokens": x} for x in val_b.eval_batches(B, T, config.eval_batches)]
    lengths = np.asarray(D.token_byte_lengths(tok), np.int64)
    eval_bytes = float(sum(lengths[b["tokens"][:, 1:]].sum() for b in evals))
    return TaskData(
        lambda step: {"tokens": train_b.batch(step, B, T, seed)},
        evals,
        tok,
        summary,
        eval_bytes=eval_bytes,
        train_rows=lambda step, a, b: {"tokens": train_b.batch(step, B, T, seed, slice(a, b))},
    )

  def sample(self, data, model_cfg, params, config):
    """The config's prompt continued with the KV cache."""
    return self.continue_prompt(data, model_cfg, params, config)

  def continue_prompt(self, data, model_cfg, params, config, **options) -> str:
    """config.sample.prompt (cut to the model's length; an empty one starts a line) and its
    continuation by generate_sample (`options` passed on), as text."""
    tok = data.tokenizer
    ids = tok.encode(config.sample.prompt)
    prompt = (ids or tok.encode("\n"))[-model_cfg.max_len :]
    out = generate_sample(model_cfg, params, config, prompt, **options)
    prefix = config.sample.prompt if prompt == ids else tok.decode(prompt)
    return prefix + tok.decode(out.ids()[0])


def generate_sample(model_cfg, params, config, prompt: list[int], **options):
  """`prompt` continued with the KV cache as config.sample says (max_new_tokens, temperature,
  top_k; the run's seed); `options` go to decode.generate (stop tokens, a prefix prompt)."""
  from transformers_jax import decode

  return decode.generate(
      model_cfg,
      params,
      [prompt],
      config.sample.max_new_tokens,
      temperature=config.sample.temperature,
      top_k=config.sample.top_k,
      seed=config.seed,
      **options,
  )
