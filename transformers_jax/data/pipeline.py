"""Batches over a token cache, delivered by grain with worker processes and prefetch.

A batch is a pure function of (seed, step): `StepBatches(step)` returns this JAX process's rows
of the global batch and reads only those rows from the memory-mapped shards. Resuming at step
s therefore starts the grain dataset at s and gives the same batches as a run that never
stopped, whatever the number of workers (grain keeps the order of a map over step indices).

Language modelling takes random windows of the token stream. With `packing`, rows are whole
documents packed end to end instead: each row starts at a random piece and takes the following
ones while they fit, with segment ids (1, 2, ... per piece, 0 for padding) and positions that
restart at every piece. A document that fits a row is one piece; a longer one is cut into
pieces of exactly a row (the last one ending at the document's end, overlapping the one before),
so every token of every document is trained on, and each such piece fills a row of its own as an
unpacked window would. Held-out rows are packed the same way, in order, so the validation loss
measures what training optimises.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence

import numpy as np

from transformers_jax.data.errors import DataError
from transformers_jax.data.token_cache import TokenCache


@dataclasses.dataclass(frozen=True)
class Span:
  """Tokens [lo, hi) of shard `shard`."""

  shard: int
  lo: int
  hi: int


def split_spans(cache: TokenCache, fraction: float = 0.05) -> tuple[list[Span], list[Span]]:
  """(train spans, validation spans): every 20th shard is held out when there are 20 or more,
  otherwise the last `fraction` of every shard. No token is in both."""
  shards = cache.shards
  if len(shards) >= 20:
    train = [Span(i, 0, s["tokens"]) for i, s in enumerate(shards) if i % 20 != 19]
    val = [Span(i, 0, s["tokens"]) for i, s in enumerate(shards) if i % 20 == 19]
    return train, val
  train, val = [], []
  for i, s in enumerate(shards):
    if s["tokens"] == 0:
      continue
    cut = s["tokens"] - max(1, math.ceil(s["tokens"] * fraction))
    train.append(Span(i, 0, cut))
    val.append(Span(i, cut, s["tokens"]))
  return train, val


class TokenSpans:
  """Random access to spans of a cache's shards. Rows are read with positioned reads (pread)
  rather than through a memory map, so the process's resident memory does not grow with the
  part of the corpus it has touched; files open on first use (the object pickles small into
  grain's worker processes)."""

  def __init__(self, cache: TokenCache, spans: Sequence[Span]):
    self.folder, self.dtype = cache.folder, cache.dtype
    self.spans = [s for s in spans if s.hi > s.lo]
    self._maps: dict[int, np.ndarray] = {}
    self._files: dict[int, int] = {}
    self._docs = None
    self._pieces: dict[tuple[int, int], tuple] = {}
    self._doc_shards = {s.shard for s in self.spans}
    self._cache = cache

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_maps"], state["_files"], state["_docs"], state["_pieces"] = {}, {}, None, {}
    return state

  def __del__(self):
    try:
      for fd in self._files.values():
        os.close(fd)
    except (AttributeError, TypeError, OSError):  # at interpreter exit os may be gone
      pass

  def read(self, shard: int, start: int, count: int) -> np.ndarray:
    """Tokens [start, start + count) of a shard as int32."""
    if shard not in self._files:
      self._files[shard] = os.open(self.folder / f"{shard:05d}.tokens", os.O_RDONLY)
    size = self.dtype.itemsize
    data = os.pread(self._files[shard], count * size, start * size)
    return np.frombuffer(data, self.dtype).astype(np.int32)

  def tokens(self, shard: int) -> np.ndarray:
    if shard not in self._maps:
      path = self.folder / f"{shard:05d}.tokens"
      self._maps[shard] = np.memmap(path, dtype=self.dtype, mode="r")
    return self._maps[shard]

  def lengths(self) -> np.ndarray:
    return np.asarray([s.hi - s.lo for s in self.spans], np.int64)

  def window_starts(self, length: int) -> np.ndarray:
    """Cumulative count of windows of `length` tokens that start in each span."""
    return np.cumsum(np.maximum(self.lengths() - length + 1, 0))

  def window(self, index: int, length: int, cumulative: np.ndarray) -> np.ndarray:
    """Window number `index` of all windows of `length` tokens lying inside one span."""
    k = int(np.searchsorted(cumulative, index, side="right"))
    before = int(cumulative[k - 1]) if k else 0
    span = self.spans[k]
    return self.read(span.shard, span.lo + index - before, length)

  def documents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard, start, end) of every document piece inside the spans, in order."""
    if self._docs is None:
      shard_ids, starts, ends = [], [], []
      for span in self.spans:
        doc_ends = self._cache.docs(span.shard).astype(np.int64)
        bounds = np.unique(np.concatenate([[span.lo], doc_ends, [span.hi]]))
        bounds = bounds[(bounds >= span.lo) & (bounds <= span.hi)]
        shard_ids.append(np.full(len(bounds) - 1, span.shard, np.int64))
        starts.append(bounds[:-1])
        ends.append(bounds[1:])
      self._docs = tuple(
          np.concatenate(x) if x else np.zeros(0, np.int64) for x in (shard_ids, starts, ends)
      )
    return self._docs

  def pieces(self, length: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard, start, end) of every piece the documents are cut into for rows of `length`
    tokens: a document of at most `length` tokens is one piece; a longer one gives pieces of
    `length` tokens starting every `stride` tokens, the last one ending at the document's end
    (a language model's rows overlap by one token, stride = length - 1, so that no next-token
    target is lost between two pieces)."""
    key = (length, stride)
    if key not in self._pieces:
      shard_ids, starts, ends = self.documents()
      sizes = ends - starts
      over = np.maximum(sizes - length, 0)
      counts = np.where(sizes > length, -(-over // stride) + 1, 1)
      doc = np.repeat(np.arange(len(starts)), counts)
      first = np.cumsum(counts) - counts
      j = np.arange(int(counts.sum())) - np.repeat(first, counts)
      piece_starts = starts[doc] + np.minimum(j * stride, over[doc])
      self._pieces[key] = (
          shard_ids[doc],
          piece_starts,
          np.minimum(piece_starts + length, ends[doc]),
      )
    return self._pieces[key]

  def packed_row(self, rng: np.random.Generator, length: int, pad_id: int, stride: int = 0):
    """One row of `length` tokens packed from consecutive pieces (see `pieces`; `stride` 0 =
    `length`) starting at a random one: (tokens, segment ids, positions), int32."""
    pieces = self.pieces(length, stride or length)
    n = len(pieces[0])
    if n == 0:
      raise DataError("the token cache holds no documents to pack: use more text")
    return self.pack_from(int(rng.integers(0, n)), pieces, length, pad_id)[:3]

  def pack_from(self, d: int, pieces, length: int, pad_id: int, wrap: bool = True):
    """A row packed from pieces d, d + 1, ... (after the last, the first again if `wrap`)
    while they fit: (tokens, segment ids, positions, the index of the first piece not taken)."""
    shard_ids, starts, ends = pieces
    n = len(starts)
    tokens = np.full(length, pad_id, np.int32)
    segments = np.zeros(length, np.int32)
    positions = np.zeros(length, np.int32)
    filled, segment = 0, 0
    for _ in range(n):
      size = int(ends[d] - starts[d])
      if filled and size > length - filled:
        break
      size = min(size, length - filled)
      segment += 1
      piece = self.read(int(shard_ids[d]), int(starts[d]), size)
      tokens[filled : filled + size] = piece
      segments[filled : filled + size] = segment
      positions[filled : filled + size] = np.arange(size)
      filled += size
      d = (d + 1) % n if wrap else d + 1
      if filled == length or d == n:
        break
    return tokens, segments, positions, d


def local_rows(batch_size: int, process_index: int, process_count: int) -> range:
  """The global rows of a batch this process holds (contiguous, as np.array_split cuts them)."""
  # np.array_split gives the first (batch_size % n) parts one extra row
  base, extra = divmod(batch_size, process_count)
  edges = [i * base + min(i, extra) for i in range(process_count + 1)]
  return range(edges[process_index], edges[process_index + 1])


class RowLayout:
  """How an objective turns windows of tokens into the rows its step takes (a Task's module
  defines one; the pipeline only reads windows and packs documents). Picklable: grain's worker
  processes each hold a copy."""

  overlap = 0  # tokens consecutive packed pieces of one document share (1: next-token targets)

  def window(self, seq_len: int) -> int:
    """Tokens one row reads for rows of `seq_len`."""
    return seq_len

  def finish(self, tokens, segments, positions, seed: int, step: int, rows) -> dict:
    """The batch dict of `tokens` [rows, window] (with packing also their segment ids and
    positions, else None); `rows`: the global row numbers, for per-row random streams
    (seed, step, row, ...)."""
    raise NotImplementedError

  def target_bytes(self, batch: dict, byte_lengths) -> float | None:
    """UTF-8 bytes the weighted targets of a held-out batch stand for (bits per byte), or None."""
    return None


@dataclasses.dataclass
class StepBatches:
  """step -> this process's rows of the global batch of that step, as a dict of numpy arrays
  laid out as `layout` (the objective's RowLayout) makes them."""

  data: TokenSpans
  layout: RowLayout
  batch_size: int
  seq_len: int
  seed: int
  packing: bool = False
  process_index: int = 0
  process_count: int = 1
  pad_id: int = 0

  def __post_init__(self):
    self.length = self.layout.window(self.seq_len)
    # packed LM pieces of one document overlap by a token: every next-token target is trained
    self.stride = self.length - self.layout.overlap
    self.cumulative = self.data.window_starts(self.length)
    if not self.packing and (not len(self.cumulative) or self.cumulative[-1] == 0):
      raise DataError(
          f"no span of the training tokens holds a window of {self.length} tokens: use more "
          "text or a smaller --config.seq_len"
      )

  def rows(self) -> range:
    return local_rows(self.batch_size, self.process_index, self.process_count)

  def __call__(self, step: int) -> dict:
    step = int(step)
    rows = self.rows()
    if self.packing:
      packed = [
          self.data.packed_row(
              np.random.default_rng([self.seed, step, r]), self.length, self.pad_id, self.stride
          )
          for r in rows
      ]
      tokens, segments, positions = (np.stack(x) for x in zip(*packed))
    else:
      starts = np.random.default_rng([self.seed, step]).integers(
          0, int(self.cumulative[-1]), size=self.batch_size
      )
      tokens = np.stack(
          [self.data.window(int(starts[r]), self.length, self.cumulative) for r in rows]
      )
      segments = positions = None
    return self.finish(tokens, segments, positions, step, rows)

  def finish(self, tokens, segments, positions, step, rows) -> dict:
    return self.layout.finish(tokens, segments, positions, self.seed, step, rows)

  def row(self, rng: np.random.Generator) -> tuple:
    """One row drawn with `rng` (a mixture's rows, data/mixture.py): (tokens, segment ids,
    positions) of a packed row, or (tokens of a random window, None, None)."""
    if self.packing:
      return self.data.packed_row(rng, self.length, self.pad_id, self.stride)
    start = int(rng.integers(0, int(self.cumulative[-1])))
    return self.data.window(start, self.length, self.cumulative), None, None


def eval_windows(data: TokenSpans, batch_size: int, length: int, num_batches: int) -> list:
  """Up to `num_batches` global batches of non-overlapping windows from the start of each span."""
  windows = []
  for span in data.spans:
    for start in range(span.lo, span.hi - length + 1, length):
      windows.append(data.read(span.shard, start, length))
      if len(windows) == batch_size * num_batches:
        break
    if len(windows) == batch_size * num_batches:
      break
  count = len(windows) // batch_size
  if count == 0:
    raise DataError(
        f"the validation split holds {len(windows)} windows of {length} tokens, fewer than one "
        f"batch of {batch_size}: use more text or a smaller --config.seq_len / batch_size"
    )
  return [np.stack(windows[b * batch_size : (b + 1) * batch_size]) for b in range(count)]


def packed_eval_rows(batches: StepBatches, num_batches: int) -> list[dict]:
  """Up to `num_batches` held-out batches packed as training packs its rows (see `pieces`),
  from the first piece on in order, each piece in one row only: finished batches like the
  training ones (segment ids, positions, weights)."""
  data, length = batches.data, batches.length
  pieces = data.pieces(length, batches.stride)
  n, d, rows = len(pieces[0]), 0, []
  while d < n and len(rows) < batches.batch_size * num_batches:
    tokens, segments, positions, d = data.pack_from(d, pieces, length, batches.pad_id, False)
    rows.append((tokens, segments, positions))
  count = len(rows) // batches.batch_size
  if count == 0:
    raise DataError(
        f"the validation split packs into {len(rows)} rows of {length} tokens, fewer than one "
        f"batch of {batches.batch_size}: use more text or a smaller --config.seq_len / batch_size"
    )
  out = []
  for b in range(count):
    part = rows[b * batches.batch_size : (b + 1) * batches.batch_size]
    tokens, segments, positions = (np.stack(x) for x in zip(*part))
    out.append(batches.finish(tokens, segments, positions, b, range(len(part))))
  return out


def batch_stream(fn, start: int, end: int, workers: int = 0, prefetch: int = 4) -> Iterator[dict]:
  """fn(start), fn(start + 1), ... fn(end - 1) from a grain dataset: `workers` processes
  (0 = threads in this process) compute them ahead, `prefetch` batches buffered."""
  import grain
  from absl import flags

  if not flags.FLAGS.is_parsed():  # grain reads its absl flags; a library caller parsed none
    flags.FLAGS.mark_as_parsed()
  # With worker processes the dataset runs past `end`, by more than the workers hold: a worker
  # that finishes its share ends before the stream is closed, and the batches it left behind
  # would never leave shared memory. Only the batches up to `end` are handed out.
  extra = workers * (max(prefetch, 1) + 2) if workers > 0 else 0
  ds = grain.MapDataset.range(start, end + extra).map(fn)
  it = ds.to_iter_dataset(
      grain.ReadOptions(num_threads=max(1, min(prefetch, 8)), prefetch_buffer_size=max(prefetch, 1))
  )
  if workers > 0:
    from transformers_jax.data.shm_tracker import guard_tracker

    guard_tracker()
    it = it.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=max(prefetch, 1))
    )
    return _OutOfSharedMemory(iter(it), end - start)
  return iter(it)


class _OutOfSharedMemory:
  """The batches of grain's worker processes copied into ordinary arrays as they arrive, so that
  each shared-memory block is released while the run goes on, not left to the end of the
  process (where Python reports it as "leaked shared_memory objects")."""

  def __init__(self, batches, count: int):
    self._batches, self._left = batches, count

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._left <= 0:
      raise StopIteration
    self._left -= 1
    batch = next(self._batches)
    return {k: np.array(v) for k, v in batch.items()} if isinstance(batch, dict) else batch

  def close(self) -> None:
    self._batches.close()
