"""A user's text corpus for the LM and MLM tasks (data.path: .txt, .jsonl, .parquet, .arrow or a
Hugging Face dataset folder, of any size; or data.mixture: several such sources, weighted):
tokenized once into a token cache per source, then batches from a grain pipeline sharded per
JAX process."""

from __future__ import annotations

import os
import pathlib

import jax
import numpy as np

from transformers_jax.data import pipeline, sources
from transformers_jax.data.errors import DataError
from transformers_jax.data.mixture import MixtureBatches, parse_mixture
from transformers_jax.data.token_cache import build_cache
from transformers_jax.data.tokenizers import token_byte_lengths
from transformers_jax.tasks.base import TaskData
from transformers_jax.tasks.text_data import run_tokenizer

# Text a BPE tokenizer is trained on: the first documents of the corpus, about this many bytes.
BPE_TRAIN_BYTES = 16 << 20


def tokenize_workers(config) -> int:
  return config.data.tokenize_workers or os.cpu_count() or 1


def text_cache(config, model_cfg, workdir: pathlib.Path, specials: bool):
  """(tokenizer, token cache) of the corpus at data.path."""
  tok, (cache,) = text_caches(config, model_cfg, workdir, specials, [(config.data.path, 1.0)])
  return tok, cache


def text_caches(config, model_cfg, workdir: pathlib.Path, specials: bool, paths, field="data.path"):
  """(tokenizer, [token cache of each source]) of `paths`, [(path, share of the BPE's training
  text)]: a BPE is trained on the first documents of each source, in those shares."""
  texts = None
  split = config.data.get("split", "train")
  if config.data.tokenizer == "bpe" and not (workdir / "tokenizer.json").exists():
    texts = []
    for path, share in paths:
      files = sources.list_files(path, split, field)
      texts += sources.sample_texts(files, config.data.text_field, int(BPE_TRAIN_BYTES * share))
  tok = run_tokenizer(config, model_cfg, workdir, texts, specials)
  root = pathlib.Path(config.data.cache_dir or workdir / "data") / "token_cache"

  def build():
    return [
        build_cache(
            path,
            tok,
            root,
            model_cfg.vocab_size,
            workers=tokenize_workers(config),
            text_field=config.data.text_field,
            split=split,
            field=field,
        )
        for path, _ in paths
    ]

  if jax.process_count() == 1:
    return tok, build()
  # Several hosts: process 0 tokenizes first; the others then find its cache complete on a
  # shared file system (or build their own where the folder is local).
  from jax.experimental import multihost_utils

  caches = build() if jax.process_index() == 0 else None
  multihost_utils.sync_global_devices("token cache built")
  return tok, caches or build()


def _held_out(config, maker: pipeline.StepBatches, length: int) -> list[dict]:
  """The held-out batches of one source's validation spans (`maker`: their StepBatches)."""
  if config.data.packing:  # held-out rows packed as the training rows are
    return pipeline.packed_eval_rows(maker, config.eval_batches)
  windows = pipeline.eval_windows(maker.data, config.batch_size, length, config.eval_batches)
  return [maker.finish(w, None, None, i, range(len(w))) for i, w in enumerate(windows)]


def streamed_text_data(config, model_cfg, workdir, make_layout, specials: bool) -> TaskData:
  """TaskData of a text objective over the corpus at data.path (or the sources of
  data.mixture): `make_layout(tokenizer)` is the objective's RowLayout (data/pipeline.py),
  which says how windows become rows; `specials`: its tokenizer has special ids (pad, bos,
  eos, mask)."""
  workdir = pathlib.Path(workdir)
  if config.data.get("mixture", ""):
    return mixture_text_data(config, model_cfg, workdir, make_layout, specials)
  tok, cache = text_cache(config, model_cfg, workdir, specials=specials)
  layout = make_layout(tok)
  train_spans, val_spans = pipeline.split_spans(cache)
  train = pipeline.TokenSpans(cache, train_spans)
  val = pipeline.TokenSpans(cache, val_spans)
  common = _batch_fields(config, tok, layout)
  whole = pipeline.StepBatches(train, **common)  # every row: for train_batch (all processes)
  local = pipeline.StepBatches(
      train, process_index=jax.process_index(), process_count=jax.process_count(), **common
  )
  eval_maker = pipeline.StepBatches(val, **{**common, "seed": config.seed + 1})
  evals = _held_out(config, eval_maker, whole.length)
  lengths = np.asarray(token_byte_lengths(tok), np.int64)
  counted = [layout.target_bytes(b, lengths) for b in evals]  # bits per byte, where it has one
  eval_bytes = None if None in counted else float(sum(counted))
  summary = (
      f"{config.data.path}: {cache.source_bytes:,} bytes, {cache.num_tokens:,} {tok.kind} "
      f"tokens in {len(cache.shards)} shards ({cache.folder}); "
      f"{sum(s.hi - s.lo for s in train.spans):,} train / "
      f"{sum(s.hi - s.lo for s in val.spans):,} validation tokens"
      + ("; packed documents" if config.data.packing else "")
  )
  data = TaskData(whole, evals, tok, summary)
  data.train_stream = lambda start, end: pipeline.batch_stream(
      local, start, end, config.data.workers, config.data.prefetch
  )
  data.eval_bytes = eval_bytes
  data.source = f"{config.data.path} (token cache {cache.folder.name})"
  return data


def _batch_fields(config, tok, layout) -> dict:
  """The StepBatches arguments every text source shares (one source, or a mixture's each)."""
  return dict(
      layout=layout,
      batch_size=config.batch_size,
      seq_len=config.seq_len,
      seed=config.seed,
      packing=config.data.packing,
      pad_id=tok.pad_id if tok.pad_id is not None else 0,
  )


def mixture_text_data(config, model_cfg, workdir, make_layout, specials: bool) -> TaskData:
  """TaskData of a text objective over the weighted sources of data.mixture (data/mixture.py):
  training rows mixed by grain in the weights' proportions; held-out batches from each source's
  own validation split (eval_batches of each), carrying a one-hot `source` [B, sources] from
  which the evaluation reports each source's loss; `step_metrics` the tokens seen per source."""
  mixture = parse_mixture(config.data.mixture)
  first = [s.schedule[0][1] for s in mixture]  # the BPE learns from the first step's shares
  shares = [(s.path, w / sum(first)) for s, w in zip(mixture, first)]
  tok, caches = text_caches(config, model_cfg, workdir, specials, shares, "data.mixture source")
  layout = make_layout(tok)
  common = _batch_fields(config, tok, layout)
  parts, evals, eval_bytes, lines = [], [], [], []
  lengths = np.asarray(token_byte_lengths(tok), np.int64)
  for i, (source, cache) in enumerate(zip(mixture, caches)):
    train_spans, val_spans = pipeline.split_spans(cache)
    try:
      part = pipeline.StepBatches(pipeline.TokenSpans(cache, train_spans), **common)
      maker = pipeline.StepBatches(
          pipeline.TokenSpans(cache, val_spans), **{**common, "seed": config.seed + 1}
      )
      held = _held_out(config, maker, part.length)
    except DataError as e:
      raise DataError(f"data.mixture source '{source.path}' ({source.name}): {e}") from None
    one_hot = np.zeros((config.batch_size, len(mixture)), np.float32)
    one_hot[:, i] = 1.0
    for batch in held:
      batch["source"] = one_hot[: len(next(iter(batch.values())))]
    counted = [layout.target_bytes(b, lengths) for b in held]
    eval_bytes.append(None if None in counted else float(sum(counted)))
    parts.append(part)
    evals += held
    weights = "|".join(f"{w:g}" + (f"@{s}" if s else "") for s, w in source.schedule)
    lines.append(
        f"{source.name} ({weights}): {source.path}, {cache.num_tokens:,} {tok.kind} tokens "
        f"({cache.folder.name})"
    )
  whole = MixtureBatches(parts, mixture)
  local = MixtureBatches(parts, mixture, jax.process_index(), jax.process_count())
  summary = f"mixture of {len(mixture)} sources: {'; '.join(lines)}" + (
      "; packed documents" if config.data.packing else ""
  )
  data = TaskData(whole, evals, tok, summary)
  data.train_stream = lambda start, end: pipeline.batch_stream(
      local, start, end, config.data.workers, config.data.prefetch
  )
  data.eval_bytes = None if None in eval_bytes else float(sum(eval_bytes))
  data.source_names = [s.name for s in mixture]
  data.source_eval_bytes = None if None in eval_bytes else eval_bytes
  data.step_metrics = whole.tokens_seen
  data.source = (
      f"mixture {config.data.mixture} (token caches {', '.join(c.folder.name for c in caches)})"
  )
  return data
