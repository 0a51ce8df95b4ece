"""Token files and deterministic batches for language modelling, plus BERT masking."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Sequence

import numpy as np

from transformers_jax.data.errors import DataError
from transformers_jax.data.tokenizers import Tokenizer

TEXT_SEPARATOR = "\n\n"


def _sidecar(path: pathlib.Path) -> pathlib.Path:
  return path.with_name(path.name + ".json")


def _fingerprint(texts: Sequence[str], tokenizer: Tokenizer) -> str:
  h = hashlib.sha256(tokenizer.to_json().encode("utf-8"))
  for text in texts:
    h.update(len(text).to_bytes(8, "little"))
    h.update(text.encode("utf-8"))
  return h.hexdigest()


def _atomic_write(path: pathlib.Path, write) -> None:
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except OSError as e:  # a full disk, a quota: the partial file goes, the folder is named
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise DataError(
        f"{e.strerror or e} ({path}, the token file): free space in {path.parent}, or set "
        "--config.data.cache_dir to a folder with room"
    ) from None
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def prepare_tokens(
    texts: Sequence[str], tokenizer: Tokenizer, out_path: str | os.PathLike, vocab_size: int
) -> np.memmap:
  """Tokenize ``texts`` into a flat uint16/uint32 file at ``out_path`` and memory-map it.

  Documents are joined with ``eos`` if the tokenizer has one, else with
  :data:`TEXT_SEPARATOR`. A JSON sidecar (written last, atomically) marks the
  file complete; a matching one means the file is reused as is.
  """
  path = pathlib.Path(out_path)
  dtype = np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
  meta = {
      "dtype": dtype.name,
      "vocab_size": int(vocab_size),
      "tokenizer": tokenizer.kind,
      "fingerprint": _fingerprint(texts, tokenizer),
  }
  try:
    old = json.loads(_sidecar(path).read_text())
    if {k: old.get(k) for k in meta} == meta and path.stat().st_size == old[
        "length"
    ] * dtype.itemsize:
      return np.memmap(path, dtype=dtype, mode="r")
  except (OSError, ValueError, KeyError, TypeError):
    pass

  if tokenizer.eos_id is not None:
    pieces = [np.append(ids, tokenizer.eos_id) for ids in tokenizer.encode_arrays(texts)]
    ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
  else:
    (ids,) = tokenizer.encode_arrays([TEXT_SEPARATOR.join(texts)])
  if ids.size == 0 or not any(t.strip() for t in texts):
    raise DataError("the text corpus is empty: pass non-empty .txt files with --config.data.path")
  bad = ids[(ids < 0) | (ids >= vocab_size)]
  if bad.size:
    raise DataError(
        f"token id {int(bad[0])} is outside [0, vocab_size={vocab_size}) for the {tokenizer.kind} tokenizer "
        f"(vocab {tokenizer.vocab_size}): set --config.model.vocab_size to at least {tokenizer.vocab_size}"
    )
  path.parent.mkdir(parents=True, exist_ok=True)
  _sidecar(path).unlink(missing_ok=True)
  _atomic_write(path, lambda f: f.write(ids.astype(dtype).tobytes()))
  meta["length"] = int(ids.size)
  _atomic_write(_sidecar(path), lambda f: f.write(json.dumps(meta, indent=1).encode("utf-8")))
  return np.memmap(path, dtype=dtype, mode="r")


def read_text_path(path: str | os.PathLike) -> list[tuple[str, str]]:
  """``(name, text)`` for a text file, or for every ``.txt`` file under a folder (sorted, recursive)."""
  root = pathlib.Path(path)
  fix = "pass a .txt file or a folder of .txt files with --config.data.path"
  if not root.exists():
    raise DataError(f"data.path '{root}' does not exist: {fix}")
  files = [root] if root.is_file() else sorted(root.rglob("*.txt"))
  if not files:
    raise DataError(f"data.path '{root}' holds no .txt files: {fix}")
  docs = []
  for f in files:
    try:
      text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
      raise DataError(
          f"'{f}' is not valid UTF-8 ({e.reason} at byte {e.start}): re-encode it as UTF-8"
      ) from e
    if text.strip():
      docs.append((f.name if f == root else f.relative_to(root).as_posix(), text))
  if not docs:
    raise DataError(f"data.path '{root}' contains only empty text: {fix}")
  return docs


class LMBatches:
  """Random windows of a 1-D token array, a pure function of (seed, step)."""

  def __init__(self, tokens: np.ndarray):
    if np.ndim(tokens) != 1:
      raise DataError(
          f"LMBatches needs a 1-D token array, got shape {np.shape(tokens)}: flatten the tokens"
      )
    self.tokens = tokens

  def _check(self, what: str, need: int) -> None:
    if len(self.tokens) < need:
      raise DataError(
          f"token array has {len(self.tokens)} tokens but {what} needs at least {need}: "
          "use more text or a smaller --config.seq_len"
      )

  def batch(
      self, step: int, batch_size: int, seq_len: int, seed: int, rows: slice = slice(None)
  ) -> np.ndarray:
    """int32 [batch_size, seq_len + 1]: inputs are ``[:, :-1]``, targets ``[:, 1:]``. With
    `rows`, only those rows of that batch are read (a process's share of a global batch)."""
    self._check(f"seq_len {seq_len}", seq_len + 1)
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(self.tokens) - seq_len, size=batch_size)[rows]
    return np.asarray(self.tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)

  def eval_batches(
      self, batch_size: int, seq_len: int, num_batches: int | None = None
  ) -> list[np.ndarray]:
    """Non-overlapping sequential windows from the start; at most ``num_batches`` full batches."""
    self._check(f"an eval batch of {batch_size} x {seq_len}", batch_size * seq_len + 1)
    full = (len(self.tokens) - 1) // seq_len // batch_size
    count = full if num_batches is None else min(num_batches, full)
    idx = np.arange(seq_len + 1)
    return [
        np.asarray(
            self.tokens[(b * batch_size + np.arange(batch_size))[:, None] * seq_len + idx],
            dtype=np.int32,
        )
        for b in range(count)
    ]


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    vocab_size: int,
    mask_id: int,
    special_ids: Sequence[int],
    prob: float = 0.15,
    rows: slice | None = None,
    batch_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """BERT masking: pick ``prob`` of non-special positions; 80% -> mask, 10% -> random, 10% kept.

  Returns int32 ``inputs``, int32 ``labels`` (the original tokens) and float32
  ``weights`` (1 at the picked positions). Random tokens are never special. With ``rows``,
  ``tokens`` are those rows of a batch of ``batch_size`` rows, masked exactly as that batch.
  """
  tokens = np.asarray(tokens)
  special = np.unique(np.asarray([*special_ids, mask_id], dtype=np.int64))
  candidates = np.setdiff1d(np.arange(vocab_size), special)
  shape, cut = tokens.shape, slice(None)
  if rows is not None:  # the draws of the whole batch (cheap), cut to the rows
    shape, cut = (batch_size, *tokens.shape[1:]), rows
  picked = (rng.random(shape)[cut] < prob) & ~np.isin(tokens, special)
  choice = rng.random(shape)[cut]
  random_tokens = candidates[rng.integers(0, len(candidates), size=shape)[cut]]
  inputs = np.where(picked & (choice < 0.8), mask_id, tokens)
  inputs = np.where(picked & (choice >= 0.8) & (choice < 0.9), random_tokens, inputs)
  return inputs.astype(np.int32), tokens.astype(np.int32), picked.astype(np.float32)
