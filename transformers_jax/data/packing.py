"""Packing whole short examples into fixed-length rows: texts to classify and seq2seq pairs.

A packed row holds several examples one after another. `segment_ids` number them 1, 2, ... in
the row (0 = padding) and `positions` restart at 0 at each example's first token, so a model
that attends only within a segment computes for each example what it computes unpacked.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def fit_examples(sizes: Sequence[Sequence[int]], capacity: Sequence[int], max_examples: int):
  """Indices of the examples one row takes: in order, each one whose sizes all fit what is left
  of `capacity` (one size per packed sequence, e.g. source and target), up to `max_examples`;
  one that does not fit is passed over, so a later, shorter one may still go in."""
  left = list(capacity)
  taken = []
  for i, size in enumerate(sizes):
    if len(taken) == max_examples:
      break
    if all(s <= room for s, room in zip(size, left)):
      taken.append(i)
      left = [room - s for s, room in zip(size, left)]
  return taken


def pack_sequences(pieces: Sequence[Sequence[int]], length: int, pad_id: int):
  """Token lists laid one after another in a row of `length`: int32 (tokens, segment ids,
  positions, starts), `starts` [len(pieces)] being each piece's first index in the row."""
  tokens = np.full(length, pad_id, np.int32)
  segments = np.zeros(length, np.int32)
  positions = np.zeros(length, np.int32)
  starts = np.zeros(len(pieces), np.int32)
  filled = 0
  for i, piece in enumerate(pieces):
    n = len(piece)
    if filled + n > length:
      raise ValueError(f"pieces of {filled + n} tokens do not fit a row of {length}")
    tokens[filled : filled + n] = piece
    segments[filled : filled + n] = i + 1
    positions[filled : filled + n] = np.arange(n)
    starts[i] = filled
    filled += n
  return tokens, segments, positions, starts


def unpadded(row, mask) -> list[int]:
  """The tokens of a padded row where `mask` is nonzero."""
  return [int(t) for t, m in zip(row, mask) if m]


def pack_pairs(pairs: Sequence[tuple[list[int], list[int], list[int]]], src_len, tgt_len, pad_id):
  """One packed seq2seq row from (source, target input, target output) token lists that fit:
  {src, tgt_in, tgt_out, src_mask, tgt_mask, src_segments, src_positions, tgt_segments,
  tgt_positions} [length] each. Source and target of example i share segment id i + 1, which is
  what keeps cross-attention within an example."""
  src, src_seg, src_pos, _ = pack_sequences([p[0] for p in pairs], src_len, pad_id)
  tgt_in, tgt_seg, tgt_pos, _ = pack_sequences([p[1] for p in pairs], tgt_len, pad_id)
  tgt_out = pack_sequences([p[2] for p in pairs], tgt_len, pad_id)[0]
  return {
      "src": src,
      "tgt_in": tgt_in,
      "tgt_out": tgt_out,
      "src_mask": (src_seg > 0).astype(np.int32),
      "tgt_mask": (tgt_seg > 0).astype(np.int32),
      "src_segments": src_seg,
      "src_positions": src_pos,
      "tgt_segments": tgt_seg,
      "tgt_positions": tgt_pos,
  }


def pairs_of_batch(batch: dict) -> list[tuple[list[int], list[int], list[int]]]:
  """(source, target input, target output) token lists of each row of an unpacked seq2seq
  batch."""
  return [
      (unpadded(s, sm), unpadded(ti, tm), unpadded(to, tm))
      for s, sm, ti, to, tm in zip(
          batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_out"], batch["tgt_mask"]
      )
  ]


def seq2seq_one_per_row(batch: dict) -> dict:
  """An unpacked seq2seq batch in the packed layout: one example per row (segment 1)."""
  B, S = batch["src"].shape
  T = batch["tgt_in"].shape[1]
  return {
      **batch,
      "src_segments": batch["src_mask"].astype(np.int32),
      "src_positions": np.broadcast_to(np.arange(S, dtype=np.int32), (B, S)).copy(),
      "tgt_segments": batch["tgt_mask"].astype(np.int32),
      "tgt_positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
  }


def classify_one_per_row(batch: dict, examples_per_row: int) -> dict:
  """An unpacked text classification batch (tokens, attention_mask, labels [B], weights [B]) in
  the packed layout: one example per row, in slot 0 of labels / weights / starts [B, K]."""
  B, T = batch["tokens"].shape
  labels = np.zeros((B, examples_per_row), np.int32)
  weights = np.zeros((B, examples_per_row), np.float32)
  labels[:, 0], weights[:, 0] = batch["labels"], batch["weights"]
  return {
      "tokens": batch["tokens"],
      "segment_ids": batch["attention_mask"].astype(np.int32),
      "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
      "starts": np.zeros((B, examples_per_row), np.int32),
      "labels": labels,
      "weights": weights,
  }
