"""A user's text corpus (data.path: .txt, .jsonl, .parquet of any size) for the LM and MLM tasks:
tokenized once into a token cache, then batches from a grain pipeline sharded per JAX process."""

from __future__ import annotations

import os
import pathlib

import jax
import numpy as np

from transformers_jax.data import pipeline, sources
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
  texts = None
  if config.data.tokenizer == "bpe" and not (workdir / "tokenizer.json").exists():
    files = sources.list_files(config.data.path)
    texts = sources.sample_texts(files, config.data.text_field, BPE_TRAIN_BYTES)
  tok = run_tokenizer(config, model_cfg, workdir, texts, specials)
  root = pathlib.Path(config.data.cache_dir or workdir / "data") / "token_cache"

  def build():
    return build_cache(
        config.data.path,
        tok,
        root,
        model_cfg.vocab_size,
        workers=tokenize_workers(config),
        text_field=config.data.text_field,
    )

  if jax.process_count() == 1:
    return tok, build()
  # Several hosts: process 0 tokenizes first; the others then find its cache complete on a
  # shared file system (or build their own where the folder is local).
  from jax.experimental import multihost_utils

  cache = build() if jax.process_index() == 0 else None
  multihost_utils.sync_global_devices("token cache built")
  return tok, cache or build()


def streamed_text_data(config, model_cfg, workdir, make_layout, specials: bool) -> TaskData:
  """TaskData of a text objective over the corpus at data.path: `make_layout(tokenizer)` is
  the objective's RowLayout (data/pipeline.py), which says how windows become rows;
  `specials`: its tokenizer has special ids (pad, bos, eos, mask)."""
  workdir = pathlib.Path(workdir)
  tok, cache = text_cache(config, model_cfg, workdir, specials=specials)
  layout = make_layout(tok)
  train_spans, val_spans = pipeline.split_spans(cache)
  train = pipeline.TokenSpans(cache, train_spans)
  val = pipeline.TokenSpans(cache, val_spans)
  pad = tok.pad_id if tok.pad_id is not None else 0
  common = dict(
      layout=layout,
      batch_size=config.batch_size,
      seq_len=config.seq_len,
      seed=config.seed,
      packing=config.data.packing,
      pad_id=pad,
  )
  whole = pipeline.StepBatches(train, **common)  # every row: for train_batch (all processes)
  local = pipeline.StepBatches(
      train, process_index=jax.process_index(), process_count=jax.process_count(), **common
  )
  eval_maker = pipeline.StepBatches(val, **{**common, "seed": config.seed + 1})
  if config.data.packing:  # held-out rows packed as the training rows are
    evals = pipeline.packed_eval_rows(eval_maker, config.eval_batches)
  else:
    windows = pipeline.eval_windows(val, config.batch_size, whole.length, config.eval_batches)
    evals = [eval_maker.finish(w, None, None, i, range(len(w))) for i, w in enumerate(windows)]
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
