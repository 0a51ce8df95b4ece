"""Sequence-to-sequence data: numbers in digits <-> English words, or user TSV pairs.

Batches are dicts of int32 arrays: ``src`` [B, S], ``tgt_in`` [B, T] (bos +
target), ``tgt_out`` [B, T] (target + eos), ``src_mask`` and ``tgt_mask``
(1 real, 0 pad). Pairs that do not fit raise :class:`DataError`; nothing is
truncated.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import numpy as np

from transformers_jax.data.errors import DataError
from transformers_jax.data.sampling import epoch_indices, eval_index_batches
from transformers_jax.data.tokenizers import Tokenizer

MAX_NUMBER = 999_999_999
DIRECTIONS = ("digits_to_words", "words_to_digits")
_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = ["", ""] + "twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((1_000_000, "million"), (1_000, "thousand"), (1, ""))
_VALIDATION_STREAM = (
    0x5EED  # rng stream of the validation set, apart from every training (seed, step)
)


def number_to_words(n: int) -> str:
  """English words for 0 <= n <= 999,999,999, e.g. 4213 -> 'four thousand two hundred thirteen'."""
  if not 0 <= n <= MAX_NUMBER:
    raise DataError(
        f"number {n} is outside [0, {MAX_NUMBER}]: number_to_words covers up to 999,999,999"
    )
  if n == 0:
    return "zero"
  words: list[str] = []
  for scale, name in _SCALES:
    chunk = n // scale % 1000
    if not chunk:
      continue
    hundreds, rest = divmod(chunk, 100)
    if hundreds:
      words += [_ONES[hundreds], "hundred"]
    if rest >= 20:
      tens, ones = divmod(rest, 10)
      words.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest:
      words.append(_ONES[rest])
    if name:
      words.append(name)
  return " ".join(words)


def encode_pairs(
    pairs: Sequence[tuple[str, str]],
    tokenizer: Tokenizer,
    src_len: int,
    tgt_len: int,
    names: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
  """Tokenize and pad ``pairs`` into a batch dict; a pair that does not fit raises DataError."""
  if None in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id):
    raise DataError(
        f"seq2seq needs pad/bos/eos ids but the {tokenizer.kind} tokenizer has none: "
        "use ByteTokenizer(specials=True) or a BPE tokenizer"
    )
  b = len(pairs)
  src = np.full((b, src_len), tokenizer.pad_id, np.int32)
  tgt_in = np.full((b, tgt_len), tokenizer.pad_id, np.int32)
  tgt_out = tgt_in.copy()
  src_lens, tgt_lens = np.zeros(b, np.int32), np.zeros(b, np.int32)
  for i, (source, target) in enumerate(pairs):
    s, t = tokenizer.encode(source), tokenizer.encode(target)
    name = names[i] if names is not None else f"pair {i}"
    if len(s) > src_len or len(t) + 1 > tgt_len:
      raise DataError(
          f"{name} needs {len(s)} source / {len(t) + 1} target tokens (with eos) but src_len={src_len}, "
          f"tgt_len={tgt_len}: raise --config.seq_len (and model.max_len; sources alone: "
          "--config.data.source_len) or shorten the pair"
      )
    src[i, : len(s)] = s
    tgt_in[i, : len(t) + 1] = [tokenizer.bos_id, *t]
    tgt_out[i, : len(t) + 1] = [*t, tokenizer.eos_id]
    src_lens[i], tgt_lens[i] = len(s), len(t) + 1
  return {
      "src": src,
      "tgt_in": tgt_in,
      "tgt_out": tgt_out,
      "src_mask": (np.arange(src_len) < src_lens[:, None]).astype(np.int32),
      "tgt_mask": (np.arange(tgt_len) < tgt_lens[:, None]).astype(np.int32),
  }


class PairBatches:
  """A fixed list of pairs, encoded once; ``batch`` is a pure function of (seed, step)."""

  def __init__(
      self,
      pairs: Sequence[tuple[str, str]],
      tokenizer: Tokenizer,
      src_len: int,
      tgt_len: int,
      names: Sequence[str] | None = None,
  ):
    if not pairs:
      raise DataError("PairBatches got no pairs: pass at least one (source, target) pair")
    self.pairs = list(pairs)
    self.arrays = encode_pairs(self.pairs, tokenizer, src_len, tgt_len, names)

  def __len__(self) -> int:
    return len(self.pairs)

  def batch(
      self, step: int, batch_size: int, seed: int, rows: slice = slice(None)
  ) -> dict[str, np.ndarray]:
    """The batch of `step`; with `rows`, only those rows of it."""
    idx = epoch_indices(len(self), step, batch_size, seed)[rows]
    return {k: v[idx] for k, v in self.arrays.items()}

  def eval_batches(self, batch_size: int) -> list[dict[str, np.ndarray]]:
    """All pairs in order; ``weights`` is 0 on the padding of the last batch."""
    return [
        {**{k: v[idx] for k, v in self.arrays.items()}, "weights": w}
        for idx, w in eval_index_batches(len(self), batch_size)
    ]


def read_tsv_rows(
    path: str | os.PathLike, columns: str = "source<TAB>target"
) -> list[tuple[int, str, str]]:
  """``(line number, first, second)`` per non-blank line of a UTF-8 file of two tab-separated
  columns (named `columns` in the errors, which name the line)."""
  path = pathlib.Path(path)
  fix = f"write one '{columns}' pair per line"
  if not path.is_file():
    raise DataError(f"pairs file '{path}' does not exist: pass a .tsv file, {fix}")
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except UnicodeDecodeError as e:
    raise DataError(
        f"pairs file '{path}' is not valid UTF-8 ({e.reason}): a .tsv of '{columns}' lines in "
        "UTF-8 is expected (re-encode it, or give the task's kind of file)"
    ) from e
  rows = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    if "\t" not in line:
      raise DataError(f"line {number} of '{path}' has no tab: {fix}")
    columns = line.split("\t")
    if len(columns) != 2:
      raise DataError(
          f"line {number} of '{path}' has {len(columns)} tab-separated columns, not 2: {fix}"
      )
    rows.append((number, *columns))
  if not rows:
    raise DataError(f"pairs file '{path}' holds no pairs: {fix}")
  return rows


def load_tsv_pairs(
    path: str | os.PathLike, columns: str = "source<TAB>target"
) -> list[tuple[str, str]]:
  """``(first, second)`` per non-blank line of a UTF-8 file: exactly two tab-separated columns."""
  return [(s, t) for _, s, t in read_tsv_rows(path, columns)]


def _mix64(x: np.ndarray) -> np.ndarray:
  """splitmix64 finaliser: a fixed, well-spread hash of uint64 values."""
  x = np.atleast_1d(np.asarray(x, dtype=np.uint64)) + np.uint64(0x9E3779B97F4A7C15)
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


class NumberPairs:
  """Numbers in digits <-> English words, generated on the fly.

  The number of digits is uniform, then the value is uniform among numbers
  with that many digits, so short and long numbers are equally common.
  Numbers whose hash falls under ``val_fraction`` form the validation set and
  never appear in training batches.
  """

  def __init__(
      self,
      direction: str = "digits_to_words",
      max_value: int = MAX_NUMBER,
      val_fraction: float = 0.05,
  ):
    if direction not in DIRECTIONS:
      raise DataError(f"unknown direction {direction!r}: use one of {DIRECTIONS}")
    if not 100 <= max_value <= MAX_NUMBER or not 0.0 < val_fraction < 1.0:
      raise DataError(
          f"bad NumberPairs max_value={max_value}, val_fraction={val_fraction}: "
          f"use 100 <= max_value <= {MAX_NUMBER} and 0 < val_fraction < 1"
      )
    self.direction, self.max_value, self.val_fraction = direction, max_value, val_fraction
    held_out = self.is_validation(np.arange(min(max_value + 1, 1000)))
    if held_out.all() or not held_out.any():
      raise DataError(
          f"val_fraction={val_fraction} leaves no training or no validation numbers: use e.g. 0.05"
      )

  def is_validation(self, numbers: np.ndarray) -> np.ndarray:
    """Boolean mask: which numbers belong to the held-out validation set."""
    return (_mix64(numbers) >> np.uint64(11)).astype(np.float64) / 2.0**53 < self.val_fraction

  def pair(self, n: int) -> tuple[str, str]:
    digits, words = str(int(n)), number_to_words(int(n))
    return (digits, words) if self.direction == "digits_to_words" else (words, digits)

  def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
    num_digits = rng.integers(1, len(str(self.max_value)) + 1, size=size)
    low = np.where(num_digits == 1, 0, 10 ** (num_digits - 1))
    high = np.minimum(10**num_digits - 1, self.max_value)
    return rng.integers(low, high + 1)

  def draw_training(self, rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` training numbers drawn from `rng`, never validation ones."""
    kept = np.zeros(0, np.int64)
    while len(kept) < count:
      draw = self._draw(rng, 2 * count)
      kept = np.concatenate([kept, draw[~self.is_validation(draw)]])
    return kept[:count]

  def sample_numbers(self, step: int, batch_size: int, seed: int) -> np.ndarray:
    """Training numbers of batch ``step``: a pure function of (seed, step), never validation."""
    return self.draw_training(np.random.default_rng([seed, step]), batch_size)

  def batch(
      self,
      step: int,
      batch_size: int,
      src_len: int,
      tgt_len: int,
      seed: int,
      tokenizer: Tokenizer,
      rows: slice = slice(None),
  ) -> dict[str, np.ndarray]:
    """The batch of `step`; with `rows`, only those rows of it are encoded."""
    numbers = self.sample_numbers(step, batch_size, seed)[rows]
    pairs = [self.pair(n) for n in numbers]
    return encode_pairs(pairs, tokenizer, src_len, tgt_len, [f"number {n}" for n in numbers])

  def validation_pairs(self, num: int) -> list[tuple[str, str]]:
    """``num`` distinct held-out pairs, the same for every seed."""
    rng = np.random.default_rng(_VALIDATION_STREAM)
    found: dict[int, None] = {}
    for _ in range(1000):
      draw = self._draw(rng, 4 * num)
      found.update(dict.fromkeys(int(n) for n in draw[self.is_validation(draw)]))
      if len(found) >= num:
        return [self.pair(n) for n in list(found)[:num]]
    raise DataError(
        f"only {len(found)} validation numbers exist up to {self.max_value}: ask for fewer or raise max_value"
    )

  def validation(self, num: int, tokenizer: Tokenizer, src_len: int, tgt_len: int) -> PairBatches:
    return PairBatches(self.validation_pairs(num), tokenizer, src_len, tgt_len)
