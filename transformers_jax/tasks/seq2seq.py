"""Sequence to sequence (encoder-decoder): teacher forcing, padding masked out of the loss and
attention; at evaluation, greedy translations scored by exact match and BLEU."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from transformers_jax import data as D
from transformers_jax.data.sampling import epoch_indices
from transformers_jax.data.seq2seq import DIRECTIONS
from transformers_jax.errors import UserError
from transformers_jax.tasks.base import Task, TaskData
from transformers_jax.tasks.text_data import run_tokenizer, split_rows


def _unpadded(row, mask) -> list[int]:
  return [int(t) for t, m in zip(row, mask) if m]


def _until(ids, stop) -> list[int]:
  ids = [int(t) for t in ids]
  return ids[: ids.index(stop)] if stop in ids else ids


def lengths(config) -> tuple[int, int]:
  """(source, target) row lengths: data.source_len (0 = seq_len) and seq_len."""
  source = config.data.get("source_len", 0) or config.seq_len
  if source < 0:
    raise UserError(f"data.source_len={source}: give a positive length, or 0 for seq_len")
  return source, config.seq_len


PACKING_KEYS = ("src_segments", "src_positions", "tgt_segments", "tgt_positions")


class Translation(Task):
  """Bundled: integers in digits <-> English words, generated on the fly. User data: a TSV of
  `source<TAB>target`."""

  name = "seq2seq"
  summary = "sequence to sequence with teacher forcing; greedy BLEU at evaluation (encoder_decoder)"
  families = ("encoder_decoder",)
  bundled_data = "numbers"
  language_model = True
  causal = True  # the decoder's self-attention
  packs = "examples"
  reads_fields = ("data.source_len", "data.eval_translations")
  eval_translation_batches = 2  # held-out batches translated at each evaluation

  def check(self, config, model_cfg):
    super().check(config, model_cfg)
    if config.data.direction not in DIRECTIONS:
      raise ValueError(
          f"data.direction={config.data.direction!r}: choose one of {', '.join(DIRECTIONS)}"
      )

  def batch_shapes(self, model_cfg, config):
    B, (S, T) = config.batch_size, lengths(config)
    keys = ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask")
    if config.data.packing:  # whole pairs packed into rows (see data/packing.py)
      keys += PACKING_KEYS
    shapes = {k: ((B, S if k.startswith("src") else T), np.int32) for k in keys}
    return {**shapes, "weights": ((B,), np.float32)}  # 0 for the padding rows of a last batch

  def synthetic_batch(self, model_cfg, config, seed: int = 0):
    out = super().synthetic_batch(model_cfg, config, seed)
    if config.data.packing:  # one whole-row example per row
      out["src_segments"], out["tgt_segments"] = out["src_mask"], out["tgt_mask"]
      for side, rows in (("src", out["src"]), ("tgt", out["tgt_in"])):
        positions = np.arange(rows.shape[1], dtype=np.int32)
        out[f"{side}_positions"] = np.broadcast_to(positions, rows.shape).copy()
    return out

  def outputs(self, model, variables, batch, rngs, mutable):
    packing = {k: batch[k] for k in PACKING_KEYS} if "src_segments" in batch else None
    out, state = model.apply(
        variables,
        batch["src"],
        batch["tgt_in"],
        batch["src_mask"],
        batch["tgt_mask"],
        packing=packing,
        rngs=rngs,
        mutable=mutable,
    )
    weights = batch["tgt_mask"].astype(jnp.float32) * batch["weights"][:, None]
    return (out["logits"], batch["tgt_out"], weights), state

  def data(self, config, model_cfg, workdir):
    B, (S, T), seed = config.batch_size, lengths(config), config.seed
    if config.data.path:
      numbered = D.read_tsv_rows(config.data.path)
      rows = [(s, t) for _, s, t in numbered]
      texts = [s for s, _ in rows] + [t for _, t in rows]
      tok = run_tokenizer(config, model_cfg, workdir, texts, specials=True)
      names = [f"'{config.data.path}' line {n}" for n, _, _ in numbered]
      train_idx, val_idx = split_rows(len(rows), config.data.path)
      train = D.PairBatches([rows[i] for i in train_idx], tok, S, T, [names[i] for i in train_idx])
      val = D.PairBatches([rows[i] for i in val_idx], tok, S, T, [names[i] for i in val_idx])
      summary = f"{len(rows)} pairs from {config.data.path}"

      def pair_rows(step, start, stop):
        return train.batch(step, B, seed, slice(start, stop))

      def candidates(step, r):  # row r's share of an epoch order of B * K pairs
        idx = epoch_indices(len(train), step, B * K, seed)[r * K : (r + 1) * K]
        return D.pairs_of_batch({k: v[idx] for k, v in train.arrays.items()})

    else:
      pairs = D.NumberPairs(config.data.direction, config.data.max_number)
      tok = run_tokenizer(config, model_cfg, workdir, None, specials=True)
      val = pairs.validation(B * config.eval_batches, tok, S, T)
      summary = (
          f"numbers {config.data.direction} up to {config.data.max_number:,}, "
          f"{len(val)} held-out pairs"
      )

      def pair_rows(step, start, stop):
        return pairs.batch(step, B, S, T, seed, tok, slice(start, stop))

      def candidates(step, r):  # K numbers from row r's own (seed, step, r) stream
        numbers = pairs.draw_training(np.random.default_rng([seed, step, r]), K)
        batch = D.encode_pairs([pairs.pair(n) for n in numbers], tok, S, T)
        return D.pairs_of_batch(batch)

    K = config.data.examples_per_row

    def train_rows(step, start, stop):
      """Rows [start, stop) of the batch of `step`, building no other row."""
      if not config.data.packing:
        return {**pair_rows(step, start, stop), "weights": np.ones(stop - start, np.float32)}
      rows = []
      for r in range(start, stop):
        drawn = candidates(step, r)
        sizes = [(len(s), len(t)) for s, t, _ in drawn]
        rows.append(
            D.pack_pairs([drawn[i] for i in D.fit_examples(sizes, (S, T), K)], S, T, tok.pad_id)
        )
      return {
          **{k: np.stack([row[k] for row in rows]) for k in rows[0]},
          "weights": np.ones(stop - start, np.float32),
      }

    evals = val.eval_batches(B)
    count = config.data.get("eval_translations", 0)
    if not 0 <= count <= len(val):
      raise UserError(
          f"data.eval_translations={count}: the held-out set has {len(val)} pairs "
          f"(batch_size x eval_batches): give 0 to {len(val)}, or raise eval_batches"
      )
    decodes = val.eval_batches(count)[:1] if count else None  # the first `count`, one batch
    if config.data.packing:  # held-out pairs one per row, in the layout the step takes
      evals = [D.seq2seq_one_per_row(b) for b in evals]
      decodes = decodes and [D.seq2seq_one_per_row(b) for b in decodes]
    return TaskData(
        lambda step: train_rows(step, 0, B),
        evals,
        tok,
        summary,
        train_rows=train_rows,
        decode_batches=decodes,
    )

  def eval_metrics(self, data, model_cfg, params):
    """Greedy translations of the first held-out pairs (KV cache; data.eval_translations of
    them, else the first two batches): exact match (fraction of outputs equal to the reference)
    and corpus BLEU (sacrebleu)."""
    import sacrebleu

    from transformers_jax import decode

    tok = data.tokenizer
    hyps, refs = [], []
    batches = data.decode_batches or data.eval_batches[: self.eval_translation_batches]
    for batch in batches:
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
