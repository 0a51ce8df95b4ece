"""Sequence to sequence (encoder-decoder): teacher forcing, padding masked out of the loss and
attention; at evaluation, greedy translations scored by exact match and BLEU."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from transformers_jax import data as D
from transformers_jax.tasks.base import Task, TaskData
from transformers_jax.tasks.text_data import run_tokenizer, split_rows


def _unpadded(row, mask) -> list[int]:
  return [int(t) for t, m in zip(row, mask) if m]


def _until(ids, stop) -> list[int]:
  ids = [int(t) for t in ids]
  return ids[: ids.index(stop)] if stop in ids else ids


class Translation(Task):
  """Bundled: integers in digits <-> English words, generated on the fly. User data: a TSV of
  `source<TAB>target`."""

  name = "seq2seq"
  bundled_data = "numbers"
  language_model = True
  eval_translation_batches = 2  # held-out batches translated at each evaluation

  def batch_shapes(self, model_cfg, config):
    B, T = config.batch_size, config.seq_len
    shapes = {k: ((B, T), np.int32) for k in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask")}
    return {**shapes, "weights": ((B,), np.float32)}  # 0 for the padding rows of a last batch

  def outputs(self, model, variables, batch, rngs, mutable):
    out, state = model.apply(
        variables,
        batch["src"],
        batch["tgt_in"],
        batch["src_mask"],
        batch["tgt_mask"],
        rngs=rngs,
        mutable=mutable,
    )
    weights = batch["tgt_mask"].astype(jnp.float32) * batch["weights"][:, None]
    return (out["logits"], batch["tgt_out"], weights), state

  def data(self, config, model_cfg, workdir):
    B, T, seed = config.batch_size, config.seq_len, config.seed
    if config.data.path:
      numbered = D.read_tsv_rows(config.data.path)
      rows = [(s, t) for _, s, t in numbered]
      texts = [s for s, _ in rows] + [t for _, t in rows]
      tok = run_tokenizer(config, model_cfg, workdir, texts, specials=True)
      names = [f"'{config.data.path}' line {n}" for n, _, _ in numbered]
      train_idx, val_idx = split_rows(len(rows), config.data.path)
      train = D.PairBatches([rows[i] for i in train_idx], tok, T, T, [names[i] for i in train_idx])
      val = D.PairBatches([rows[i] for i in val_idx], tok, T, T, [names[i] for i in val_idx])
      summary = f"{len(rows)} pairs from {config.data.path}"
      pair_batch = lambda step: train.batch(step, B, seed)  # noqa: E731
    else:
      pairs = D.NumberPairs(config.data.direction, config.data.max_number)
      tok = run_tokenizer(config, model_cfg, workdir, None, specials=True)
      val = pairs.validation(B * config.eval_batches, tok, T, T)
      summary = (
          f"numbers {config.data.direction} up to {config.data.max_number:,}, "
          f"{len(val)} held-out pairs"
      )
      pair_batch = lambda step: pairs.batch(step, B, T, T, seed, tok)  # noqa: E731

    def batch(step):
      return {**pair_batch(step), "weights": np.ones(B, np.float32)}

    return TaskData(batch, val.eval_batches(B), tok, summary)

  def eval_metrics(self, data, model_cfg, params):
    """Greedy translations of the first held-out batches (KV cache): exact match (fraction of
    outputs equal to the reference) and corpus BLEU (sacrebleu)."""
    import sacrebleu

    from transformers_jax import decode

    tok = data.tokenizer
    hyps, refs = [], []
    for batch in data.eval_batches[: self.eval_translation_batches]:
      src_len, tgt_len = batch["src"].shape[1], batch["tgt_out"].shape[1]
      # every row, padding rows too, so that each batch has the same shapes (one compilation)
      sources = [_unpadded(s, m) or [tok.eos_id] for s, m in zip(batch["src"], batch["src_mask"])]
      out = decode.translate(
          model_cfg,
          params,
          sources,
          tok.bos_id,
          tok.eos_id,
          tgt_len,
          beam_size=0,
          source_len=src_len,
      )
      weights = batch.get("weights", np.ones(len(sources)))
      for ids, target, w in zip(out.ids(), batch["tgt_out"], weights):
        if w > 0:
          hyps.append(tok.decode(ids))
          refs.append(tok.decode(_until(target, tok.eos_id)))
    exact = sum(h == r for h, r in zip(hyps, refs)) / max(len(hyps), 1)
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score if hyps else 0.0
    return {"eval_exact_match": exact, "eval_bleu": bleu}

  def sample(self, data, model_cfg, params, config):
    """Three held-out sources translated with beam search."""
    from transformers_jax import decode

    tok = data.tokenizer
    batch = data.eval_batches[0]
    n = min(3, len(batch["src"]))
    sources = [
        _unpadded(s, m) or [tok.eos_id] for s, m in zip(batch["src"][:n], batch["src_mask"][:n])
    ]
    out = decode.translate(
        model_cfg,
        params,
        sources,
        tok.bos_id,
        tok.eos_id,
        min(config.sample.max_new_tokens, batch["tgt_out"].shape[1]),
    )
    return "\n".join(
        f"{tok.decode(src)} -> {tok.decode(ids)}" for src, ids in zip(sources, out.ids())
    )
