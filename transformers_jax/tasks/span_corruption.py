"""T5's span corruption for the encoder-decoder (Raffel et al. 2020, section 3.1.4): a window of
text loses `noise_density` of its tokens in spans of `mean_span` tokens on average; the
encoder reads the rest with one sentinel id in place of each span, the decoder writes each
sentinel followed by the span it stands for. Sentinels are the ids above the tokenizer's, from
the top of the model's vocabulary down (T5's extra ids). Bundled data: the corpus (as for lm
and mlm); `--config.data.path` streams a user's text, packed documents with data.packing.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from transformers_jax import data as D
from transformers_jax.data.pipeline import RowLayout
from transformers_jax.tasks.base import Task, TaskData
from transformers_jax.tasks.seq2seq import PACKING_KEYS, Translation, lengths
from transformers_jax.tasks.text_data import token_arrays


def noise_counts(length: int, density: float, mean_span: float) -> tuple[int, int]:
  """(noise tokens, spans) of a window of `length` tokens, as T5 rounds them: at least one
  noise token and one kept token, at least one span, spans no more than either."""
  if length < 2:
    return 0, 0
  noise = min(max(int(round(length * density)), 1), length - 1)
  spans = max(1, int(round(noise / mean_span)))
  return noise, min(spans, noise, length - noise)


def window_length(source_len: int, target_len: int, density: float, mean_span: float) -> int:
  """The longest window whose corrupted source (kept tokens, a sentinel per span, eos) and
  target (a sentinel per span, the spans, eos) fit `source_len` and `target_len` tokens."""
  best = 0
  for n in range(2, 4 * (source_len + target_len)):
    noise, spans = noise_counts(n, density, mean_span)
    if n - noise + spans + 1 <= source_len and noise + spans + 1 <= target_len:
      best = n
  return best


def random_lengths(rng, total: int, parts: int) -> np.ndarray:
  """`total` split into `parts` positive lengths, uniformly among such splits."""
  cuts = np.sort(rng.choice(np.arange(1, total), parts - 1, replace=False)) if parts > 1 else []
  return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64)


def corrupt(ids, rng, density: float, mean_span: float, top_id: int):
  """(source, target) token lists of one window: kept and noise runs alternate, kept first
  (T5's random_spans_noise_mask); span i becomes sentinel top_id - i in the source, and the
  target lists each sentinel and its span."""
  ids = [int(t) for t in ids]
  noise, spans = noise_counts(len(ids), density, mean_span)
  if not spans:
    return ids, []
  noise_runs = random_lengths(rng, noise, spans)
  kept_runs = random_lengths(rng, len(ids) - noise, spans)
  source, target, at = [], [], 0
  for i in range(spans):
    source += ids[at : at + kept_runs[i]]
    at += kept_runs[i]
    source.append(top_id - i)
    target += [top_id - i, *ids[at : at + noise_runs[i]]]
    at += noise_runs[i]
  return source, target


@dataclasses.dataclass
class SpanRows(RowLayout):
  """Rows of span corruption from windows of `length` tokens (packed: each document piece
  corrupted on its own, the pairs that fit packed into the row): the encoder-decoder's batch
  layout (seq2seq's), each row corrupted from its own (seed, step, row, 3) stream."""

  source_len: int
  target_len: int
  length: int
  density: float
  mean_span: float
  top_id: int  # sentinel 0; sentinel i is top_id - i
  pad_id: int
  bos_id: int
  eos_id: int

  def window(self, seq_len):
    return self.length

  def example(self, ids, rng):
    source, target = corrupt(ids, rng, self.density, self.mean_span, self.top_id)
    return [*source, self.eos_id], [self.bos_id, *target], [*target, self.eos_id]

  def finish(self, tokens, segments, positions, seed, step, rows):
    out = []
    for i, r in enumerate(rows):
      rng = np.random.default_rng([seed, step, r, 3])
      if segments is None:
        pairs = [self.example(tokens[i], rng)]
      else:  # each piece its own example; those that do not fit what is left are passed over
        pairs, room = [], [self.source_len, self.target_len]
        for s in range(1, int(segments[i].max(initial=0)) + 1):
          pair = self.example(tokens[i][segments[i] == s], rng)
          if len(pair[0]) <= room[0] and len(pair[1]) <= room[1]:
            pairs.append(pair)
            room = [room[0] - len(pair[0]), room[1] - len(pair[1])]
      out.append(D.pack_pairs(pairs, self.source_len, self.target_len, self.pad_id))
    keys = out[0].keys() if segments is not None else [k for k in out[0] if k not in PACKING_KEYS]
    batch = {k: np.stack([row[k] for row in out]) for k in keys}
    return {**batch, "weights": np.ones(len(out), np.float32)}


class SpanCorruption(Translation):
  """Pre-training of the encoder-decoder on text: the seq2seq layout and forward pass, span
  corruption for the data; evaluation is the teacher-forced denoising loss."""

  name = "span_corruption"
  summary = "T5 span corruption: pre-train the encoder-decoder on text (data.path or the corpus)"
  bundled_data = "corpus"
  packs = "documents"
  reads_fields = ("data.source_len",)
  eval_metrics = Task.eval_metrics  # no translations to score
  sample = Task.sample

  def config_defaults(self):
    c = ml_collections.ConfigDict()
    c.noise_density = 0.15  # span_corruption: fraction of each window's tokens dropped (T5: 0.15)
    c.mean_span = 3.0  # span_corruption: mean length of a dropped span in tokens (T5: 3)
    return c

  def check(self, config, model_cfg):
    super().check(config, model_cfg)
    own = config.span_corruption
    if not 0 < own.noise_density < 1:
      raise ValueError(
          f"span_corruption.noise_density={own.noise_density!r}: the fraction of tokens "
          "dropped lies in (0, 1); T5 uses 0.15"
      )
    if not own.mean_span >= 1:
      raise ValueError(
          f"span_corruption.mean_span={own.mean_span!r}: a span holds 1 token or more; T5 uses 3"
      )

  def layout(self, config, model_cfg, tok) -> SpanRows:
    """The rows for tokenizer `tok`, after checking the model's vocabulary has room for the
    sentinels of the longest window."""
    (S, T), own = lengths(config), config.span_corruption
    length = window_length(S, T, own.noise_density, own.mean_span)
    if length < 2:
      raise ValueError(
          f"span_corruption: a source of {S} and a target of {T} tokens hold no corrupted "
          "window: raise --config.seq_len (or --config.data.source_len)"
      )
    spans = noise_counts(length, own.noise_density, own.mean_span)[1]
    free = model_cfg.vocab_size - tok.vocab_size
    if free < spans:
      raise ValueError(
          f"model.vocab_size={model_cfg.vocab_size}: span corruption's sentinels are the ids "
          f"above the tokenizer's {tok.vocab_size}, and a window of {length} tokens has up to "
          f"{spans} spans: set --config.model.vocab_size={tok.vocab_size + spans} or more"
      )
    return SpanRows(
        S,
        T,
        length,
        own.noise_density,
        own.mean_span,
        model_cfg.vocab_size - 1,
        tok.pad_id,
        tok.bos_id,
        tok.eos_id,
    )

  def data(self, config, model_cfg, workdir):
    if config.data.path or config.data.get("mixture", ""):  # streamed: stream_data.py
      from transformers_jax.tasks.stream_data import streamed_text_data

      return streamed_text_data(
          config, model_cfg, workdir, lambda tok: self.layout(config, model_cfg, tok), True
      )
    tok, train, val, summary = token_arrays(config, model_cfg, workdir, specials=True)
    rows = self.layout(config, model_cfg, tok)
    train_b, val_b = D.LMBatches(train), D.LMBatches(val)
    B, seed, n = config.batch_size, config.seed, rows.length - 1

    def train_rows(step, start, stop):
      windows = train_b.batch(step, B, n, seed, slice(start, stop))
      return rows.finish(windows, None, None, seed, step, range(start, stop))

    evals = [
        rows.finish(w, None, None, seed + 1, i, range(B))
        for i, w in enumerate(val_b.eval_batches(B, n, config.eval_batches))
    ]
    summary += f"; span corruption of {rows.length}-token windows"
    return TaskData(lambda step: train_rows(step, 0, B), evals, tok, summary, train_rows=train_rows)
