"""Masked language modelling (encoder with the MLM head): a fraction of tokens is chosen, 80% of
them replaced by [MASK], 10% by a random token, 10% kept; the loss is on the chosen ones."""

from __future__ import annotations

import dataclasses

import numpy as np

from transformers_jax import data as D
from transformers_jax.data.pipeline import RowLayout
from transformers_jax.tasks.base import Task, TaskData
from transformers_jax.tasks.text_data import token_arrays


@dataclasses.dataclass
class MaskedRows(RowLayout):
  """Streamed rows of masked LM: inputs, labels, weights [rows, seq_len] (packed, also
  segment_ids and positions); each row masked from its own (seed, step, row, 1) stream."""

  vocab_size: int = 0
  mask_id: int = 0
  special_ids: tuple = ()
  mlm_probability: float = 0.15

  @classmethod
  def of(cls, tok, mlm_probability: float) -> MaskedRows:
    """The layout for tokenizer `tok` (which must have a [MASK] token)."""
    if tok.mask_id is None:
      raise ValueError("data.tokenizer: masked LM needs a [MASK] token; use byte or bpe")
    return cls(tok.vocab_size, tok.mask_id, tuple(tok.special_ids), mlm_probability)

  def finish(self, tokens, segments, positions, seed, step, rows):
    masked = [
        D.mask_tokens(
            tokens[i],
            np.random.default_rng([seed, step, r, 1]),
            self.vocab_size,
            self.mask_id,
            self.special_ids,
            self.mlm_probability,
        )
        for i, r in enumerate(rows)
    ]
    inputs, labels, weights = (np.stack(x) for x in zip(*masked))
    out = {"inputs": inputs, "labels": labels, "weights": weights}
    if segments is not None:
      out["weights"] = weights * (segments > 0)
      out["segment_ids"], out["positions"] = segments, positions
    return out


class MaskedLM(Task):
  name = "mlm"
  summary = "masked language modelling, 80/10/10 mask/random/keep (encoder, head mlm)"
  families, heads = ("encoder",), ("mlm",)
  bundled_data = "corpus"
  language_model = True
  packs = "documents"
  synthetic_weight = 0.15

  def batch_shapes(self, model_cfg, config):
    B, T = config.batch_size, config.seq_len
    shapes = {
        "inputs": ((B, T), np.int32),
        "labels": ((B, T), np.int32),
        "weights": ((B, T), np.float32),
    }
    if config.data.packing:  # documents packed into rows (see data/pipeline.py)
      shapes.update(segment_ids=((B, T), np.int32), positions=((B, T), np.int32))
    return shapes

  def outputs(self, model, variables, batch, rngs, mutable):
    out, state = model.apply(
        variables,
        batch["inputs"],
        positions=batch.get("positions"),
        segment_ids=batch.get("segment_ids"),
        rngs=rngs,
        mutable=mutable,
    )
    return (out["logits"], batch["labels"], batch["weights"]), state

  def data(self, config, model_cfg, workdir):
    if config.data.path or config.data.get("mixture", ""):  # streamed: stream_data.py
      from transformers_jax.tasks.stream_data import streamed_text_data

      p = config.data.mlm_probability
      return streamed_text_data(config, model_cfg, workdir, lambda tok: MaskedRows.of(tok, p), True)
    tok, train, val, summary = token_arrays(config, model_cfg, workdir, specials=True)
    if tok.mask_id is None:
      raise ValueError("data.tokenizer: masked LM needs a [MASK] token; use byte or bpe")
    train_b, val_b = D.LMBatches(train), D.LMBatches(val)
    B, T, seed = config.batch_size, config.seq_len, config.seed
    p = config.data.mlm_probability

    def masked(tokens, rng, rows=None):
      inputs, labels, weights = D.mask_tokens(
          tokens, rng, tok.vocab_size, tok.mask_id, tok.special_ids, p, rows, B
      )
      return {"inputs": inputs, "labels": labels, "weights": weights}

    def train_rows(step, start, stop):
      rows = slice(start, stop)
      tokens = train_b.batch(step, B, T, seed, rows)[:, :T]
      return masked(tokens, np.random.default_rng([seed, step, 1]), rows)

    def train_batch(step):
      return masked(train_b.batch(step, B, T, seed)[:, :T], np.random.default_rng([seed, step, 1]))

    evals = [
        masked(x[:, :T], np.random.default_rng([seed, i, 2]))
        for i, x in enumerate(val_b.eval_batches(B, T, config.eval_batches))
    ]
    return TaskData(train_batch, evals, tok, summary, train_rows=train_rows)
