"""The `data` group of a training config (`--config.data.*`): where a run's examples come from
and how they are batched (docs/data.md). The comments beside the fields are their documentation
(transformers_jax/config_reference.py reads them into docs/config.md and --config_help)."""

from __future__ import annotations

import ml_collections


def add_data_fields(c: ml_collections.ConfigDict) -> None:
  """Give the training config `c` its `data` group, every field at its default."""
  c.data = ml_collections.ConfigDict()
  c.data.name = ""  # "" = the family's bundled data: corpus | corpus_kind | numbers | digits
  # user data: .txt / .jsonl / .parquet / .arrow files or folders, or a Hugging Face dataset
  # folder (LM, MLM); .tsv (seq2seq, classification); .npz (images)
  c.data.path = ""
  c.data.tokenizer = "byte"  # byte | bpe (trained locally on the training text) | a .json file
  c.data.cache_dir = ""  # where token files go; "" = WORKDIR/data
  c.data.max_bytes = 4_000_000  # size cap of the bundled corpus's training split
  c.data.mlm_probability = 0.15  # MLM: fraction of tokens chosen for prediction
  c.data.text_field = "text"  # .jsonl field / .parquet or .arrow column holding the text
  # LM / MLM: weighted text sources instead of data.path, PATH:WEIGHT,... (a schedule:
  # PATH:W0|W1@STEP), e.g. "a.jsonl:0.5,b.txt:0.3,hf_folder:0.2"; docs/data.md
  c.data.mixture = ""
  # the split of a Hugging Face dataset folder (a save_to_disk DatasetDict, or the hub's shards)
  c.data.split = "train"
  c.data.packing = False  # LM / MLM on data.path: rows of whole documents with segment ids
  # (text classification, seq2seq: rows of whole examples, which need no data.path)
  c.data.examples_per_row = 8  # packing: most examples one row holds (classification, seq2seq)
  c.data.workers = 0  # batch worker processes of the grain pipeline (0 = threads in-process)
  c.data.prefetch = 4  # batches computed ahead of the train step
  c.data.tokenize_workers = 0  # processes tokenizing data.path into its cache; 0 = all cores
  c.data.max_number = 99_999  # numbers task: largest number translated
  c.data.direction = "digits_to_words"  # numbers task: digits_to_words | words_to_digits
  c.data.source_len = 0  # seq2seq: source row length (tokens); 0 = seq_len, the target's
  # seq2seq: held-out pairs translated (greedy, in one batch) for exact match and BLEU at each
  # evaluation, the first of the eval batches' pairs; 0 = the first two eval batches
  c.data.eval_translations = 0


def check_split_is_read(data, mixture_paths: list[str]) -> None:
  """data.split, set to other than its default, chooses a split of some source: data.path's, or
  one of data.mixture's sources (`mixture_paths`; the others are read whole). A ValueError
  otherwise; a path that does not exist is left to the reader of the data, which names it."""
  from transformers_jax.data import sources

  split = data.get("split", "train")
  if split == "train":
    return
  wants = f"data.split={split!r}: chooses a split of a Hugging Face dataset folder"
  default = "leave data.split at 'train' (its default)"
  if mixture_paths:
    kinds = [sources.without_splits(p, "data.mixture source") for p in mixture_paths]
    if all(kinds):
      raise ValueError(
          f"{wants}, and no source of data.mixture has splits (the first, "
          f"'{mixture_paths[0]}', is {kinds[0]}): {default}"
      )
    return
  if not data.path:
    raise ValueError(
        f"{wants}, and this run reads its bundled data (data.path is empty), which has none: "
        f"{default}, or set data.path"
    )
  kind = sources.without_splits(data.path)
  if kind:
    raise ValueError(
        f"{wants}, and data.path '{data.path}' is {kind}, which has no splits: {default}, or "
        "give a DatasetDict saved with save_to_disk (or shards named by split)"
    )
