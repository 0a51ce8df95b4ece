"""Weighted mixtures of text sources, mixed by grain: `--config.data.mixture` names several
sources (files, folders or Hugging Face dataset folders), each with a weight, and optionally a
weight schedule over steps:

    a.jsonl:0.5,b.txt:0.3,hf_folder:0.2        three sources, 50 / 30 / 20 % of the rows
    web.jsonl:0.7|0.5@1000,code:0.3|0.5@1000   70 / 30 % up to step 1000, then 50 / 50 %

A source is PATH:WEIGHTS; WEIGHTS is a weight, then `|WEIGHT@STEP` for each change: the weight
holds from that step on (piecewise constant, Levanter's stages). Weights are relative (they
are normalised at each step), >= 0, and a source needs a positive weight somewhere; a path
holds no comma. A source's name in the metrics is its file or folder name without suffix.

Row n of the global row stream (row r of step s is n = s * batch_size + r) is drawn from the
source that grain's `MapDataset.mix` of the sources' row streams gives for n: a deterministic
interleaving in the weights' proportions (exact to a row, the weights quantized by grain to
1/100 of the smallest). A source's k-th row comes from its own random stream (seed, source, k),
whatever the other sources and weights, so a batch stays a pure function of (seed, step) and
a run resumes bit-exactly; the rows drawn from each source up to any step (`rows_drawn`) are a
function of the step alone, which the metrics report as tokens seen per source.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import pathlib
import re

import numpy as np

from transformers_jax.data.errors import DataError
from transformers_jax.data.pipeline import StepBatches, local_rows

EXAMPLE = '--config.data.mixture="a.jsonl:0.5,b.txt:0.3,hf_folder:0.2"'
# Largest ratio of two positive weights at one step: a source drawn once in every so many rows
# (and counted by scanning that far: see MixtureBatches._counts).
MAX_RATIO = 10_000
# Rows scanned past a point of a stage's interleaving to find each source's next row: more than
# weights within MAX_RATIO of each other need, for up to a few hundred sources.
SCAN_LIMIT = 1 << 24
# Rows of each grain row stream: endless, for a run's purposes.
STREAM_ROWS = 1 << 62


@dataclasses.dataclass(frozen=True)
class MixtureSource:
  """One source of a mixture: its name in the metrics, its path, and its weight schedule,
  ((first step, weight), ...) starting at step 0."""

  name: str
  path: str
  schedule: tuple[tuple[int, float], ...]

  def weight_at(self, step: int) -> float:
    starts = [s for s, _ in self.schedule]
    return self.schedule[bisect.bisect_right(starts, step) - 1][1]


def _fail(spec: str, problem: str):
  raise DataError(f"data.mixture={spec!r}: {problem}")


def _weight(spec: str, entry: str, text: str) -> float:
  try:
    weight = float(text)
  except ValueError:
    _fail(spec, f"'{entry}': weight {text!r} is not a number; write PATH:WEIGHT, e.g. {EXAMPLE}")
  if not math.isfinite(weight) or weight < 0:
    _fail(spec, f"'{entry}': weight {text!r} must be a finite number >= 0")
  return weight


def _schedule(spec: str, entry: str, text: str) -> tuple[tuple[int, float], ...]:
  """WEIGHT|WEIGHT@STEP|... -> ((0, w0), (step1, w1), ...)."""
  stages = []
  for i, part in enumerate(text.split("|")):
    weight_text, at, step_text = part.partition("@")
    step = 0
    if at:
      try:
        step = int(step_text)
      except ValueError:
        _fail(spec, f"'{entry}': {step_text!r} in {part!r} is not a step; write WEIGHT@STEP")
    if i == 0 and step != 0:
      _fail(spec, f"'{entry}': the first weight holds from step 0; write W0|W1@{step}")
    if i > 0 and (not at or step <= stages[-1][0]):
      _fail(
          spec,
          f"'{entry}': each later weight names its first step, after the one before "
          "(W0|W1@STEP1|W2@STEP2 with 0 < STEP1 < STEP2)",
      )
    stages.append((step, _weight(spec, entry, weight_text)))
  return tuple(stages)


def parse_mixture(spec: str) -> list[MixtureSource]:
  """The sources of a data.mixture string (see the module's docstring), or one line saying
  what is wrong with it. Paths are not checked here (the data is read later)."""
  entries = [e.strip() for e in spec.split(",")]
  if not spec.strip() or not all(entries):
    _fail(spec, f"an empty source; give comma-separated PATH:WEIGHT sources, e.g. {EXAMPLE}")
  parsed, names = [], {}
  for entry in entries:
    path, colon, weights = entry.rpartition(":")
    if not colon or not path.strip():
      _fail(spec, f"'{entry}' has no weight; write PATH:WEIGHT, e.g. {EXAMPLE}")
    schedule = _schedule(spec, entry, weights.strip())
    if not any(w > 0 for _, w in schedule):
      _fail(spec, f"'{entry}' never has a weight > 0, so it would never be read: remove it")
    path = path.strip()
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", pathlib.Path(path).stem or pathlib.Path(path).name)
    names[base] = names.get(base, 0) + 1
    name = base if names[base] == 1 else f"{base}_{names[base]}"  # a.txt and x/a.txt: a, a_2
    parsed.append(MixtureSource(name or f"source_{len(parsed)}", path, schedule))
  for start, weights in stages(parsed):
    positive = [w for w in weights if w > 0]
    if not positive:
      _fail(spec, f"from step {start} every weight is 0: give some source a weight > 0 there")
    if max(positive) > MAX_RATIO * min(positive):
      _fail(
          spec,
          f"from step {start} the weights {min(positive):g} and {max(positive):g} differ by more "
          f"than {MAX_RATIO:,} times: raise the smallest (or leave that source out)",
      )
  return parsed


def stages(sources: list[MixtureSource]) -> list[tuple[int, tuple[float, ...]]]:
  """(first step, every source's weight) of each stretch of steps with constant weights."""
  starts = sorted({s for source in sources for s, _ in source.schedule})
  return [(s, tuple(source.weight_at(s) for source in sources)) for s in starts]


def _tagged(source: int, k: int) -> tuple[int, int]:
  return source, k


class MixtureBatches:
  """step -> this process's rows of the global batch of a mixture, laid out by the sources'
  RowLayout (the same for every source: one tokenizer). `parts`: each source's StepBatches
  (its training spans, the batch and row settings); `sources`: the parsed mixture. Picklable
  into grain's worker processes (the grain datasets are made again on first use there)."""

  def __init__(
      self,
      parts: list[StepBatches],
      sources: list[MixtureSource],
      process_index: int = 0,
      process_count: int = 1,
  ):
    self.parts, self.sources = parts, sources
    self.batch_size, self.seed = parts[0].batch_size, parts[0].seed
    self.seq_len = parts[0].seq_len
    self.process_index, self.process_count = process_index, process_count
    self.stages = stages(sources)
    self.first_rows = [start * self.batch_size for start, _ in self.stages]  # of each stage
    self._mixes = None

  def __getstate__(self):
    return {**self.__dict__, "_mixes": None}

  # ------------------------------------------------------------------ the interleaving
  def _stage_mixes(self) -> list[tuple]:
    """Per stage: (its first global row, the grain mixture of its sources' row streams whose
    element n is (source, k): the stage's n-th row is source's k-th)."""
    if self._mixes is None:
      import grain

      mixes, bases = [], [0] * len(self.sources)
      for j, (start, weights) in enumerate(self.stages):
        active = [i for i, w in enumerate(weights) if w > 0]
        parents = [
            grain.MapDataset.range(bases[i], bases[i] + STREAM_ROWS).map(
                functools.partial(_tagged, i)
            )
            for i in active
        ]
        mixed = grain.MapDataset.mix(parents, [weights[i] for i in active])
        mixes.append((start * self.batch_size, mixed, tuple(bases)))
        if j + 1 < len(self.stages):  # where each source's stream stands when the next begins
          rows = (self.stages[j + 1][0] - start) * self.batch_size
          counts = self._counts(mixed, tuple(bases), active, rows)
          bases = [b + c for b, c in zip(bases, counts)]
      self._mixes = mixes
    return self._mixes

  def _counts(self, mixed, bases, active, rows: int) -> list[int]:
    """Rows of each source among the first `rows` of a stage: the index in its stream of the
    first row it gives at or after `rows` (grain takes each stream's rows in order)."""
    counts = [0] * len(self.sources)
    missing = set(active)
    for n in range(rows, rows + SCAN_LIMIT):
      source, k = mixed[n]
      if source in missing:
        counts[source] = k - bases[source]
        missing.discard(source)
        if not missing:
          return counts
    raise DataError(  # weights within MAX_RATIO of each other never get here
        f"data.mixture: a source was not drawn in {SCAN_LIMIT:,} rows: raise its weight"
    )

  def source_of(self, n: int) -> tuple[int, int]:
    """(source, k): global row n is the k-th row of that source's stream."""
    j = bisect.bisect_right(self.first_rows, n) - 1
    first, mixed, _ = self._stage_mixes()[j]
    return mixed[n - first]

  def rows_drawn(self, rows: int) -> np.ndarray:
    """Rows drawn from each source among the first `rows` of the global row stream."""
    j = bisect.bisect_right(self.first_rows, max(rows - 1, 0)) - 1
    first, mixed, bases = self._stage_mixes()[j]
    active = [i for i, w in enumerate(self.stages[j][1]) if w > 0]
    counts = self._counts(mixed, bases, active, rows - first) if rows > first else [0] * len(bases)
    return np.asarray([b + c for b, c in zip(bases, counts)], np.int64)

  def tokens_seen(self, step: int) -> dict[str, int]:
    """{"tokens_seen/<name>": tokens of the rows each source gave to steps [0, step)}, rows of
    seq_len tokens (packed rows: their padding included)."""
    drawn = self.rows_drawn(step * self.batch_size) * self.seq_len
    return {f"tokens_seen/{s.name}": int(c) for s, c in zip(self.sources, drawn)}

  # ------------------------------------------------------------------ batches
  def rows(self) -> range:
    return local_rows(self.batch_size, self.process_index, self.process_count)

  def __call__(self, step: int) -> dict:
    return self.rows_of(int(step), self.rows())

  def rows_of(self, step: int, rows) -> dict:
    """Rows `rows` (global row numbers) of the global batch of `step`."""
    built = []
    for r in rows:
      source, k = self.source_of(step * self.batch_size + r)
      built.append(self.parts[source].row(np.random.default_rng([self.seed, source, k])))
    tokens = np.stack([b[0] for b in built])
    segments = positions = None
    if built[0][1] is not None:
      segments, positions = np.stack([b[1] for b in built]), np.stack([b[2] for b in built])
    return self.parts[0].finish(tokens, segments, positions, step, rows)
