"""Tokenize a source once into a cache of token shards, in parallel worker processes.

Layout of a cache folder (one per source content and tokenizer, under `root/<key>/`):

  00000.tokens   flat token ids of unit 0 (uint8, uint16 or uint32: the smallest that fits)
  00000.docs     uint64 end offsets of the documents in 00000.tokens
  00000.json     the shard's record: token count, source bytes, CRC-32 of both files
  manifest.json  every shard's record, written last: a cache without it is incomplete

Shards are written to a temporary name and renamed, their record after them, so an interrupted
build keeps every finished shard and the next build tokenizes only the rest. On load every
shard's size and checksum is compared with the manifest; a shard that differs (truncated,
corrupted) is tokenized again, never used.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
import pathlib
import sys
import zlib

import numpy as np

from transformers_jax.data import sources
from transformers_jax.data.errors import DataError
from transformers_jax.data.tokenizers import Tokenizer, load_tokenizer_json

TEXT_SEPARATOR = "\n\n"
FORMAT = 1


def token_dtype(vocab_size: int) -> np.dtype:
  """The smallest unsigned integer type holding every id."""
  if vocab_size <= 2**8:
    return np.dtype(np.uint8)
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


# Content sampled for a cache's key: whole files up to WHOLE_FILE_BYTES, else the first and last
# MiB and SAMPLES evenly spaced blocks of SAMPLE_BYTES in between.
WHOLE_FILE_BYTES = 8 << 20
SAMPLES, SAMPLE_BYTES = 32, 64 << 10


def _content_sample(path: pathlib.Path, size: int) -> int:
  """CRC-32 of a file's bytes (up to WHOLE_FILE_BYTES), or of its ends and evenly spaced
  blocks: any change in a small file changes it, and a change of a MiB or more in a file of up
  to about SAMPLES MiB; the modification time beside it catches the rest, unless reset."""
  if size <= WHOLE_FILE_BYTES:
    return _file_crc(path)
  crc = 0
  offsets = [0, size - (1 << 20)] + [(size * (i + 1)) // (SAMPLES + 1) for i in range(SAMPLES)]
  with open(path, "rb") as fh:
    for offset in sorted(offsets):
      fh.seek(offset)
      crc = zlib.crc32(fh.read(1 << 20 if offset in (0, size - (1 << 20)) else SAMPLE_BYTES), crc)
  return crc


def cache_key(files: list[pathlib.Path], tokenizer: Tokenizer, text_field: str) -> str:
  """A digest of the tokenizer and the source: each file's name, size, modification time and a
  CRC-32 of its content (whole, or sampled in a large file: reading whole terabytes to name a
  cache would cost as much as building it). A file that grows, shrinks or is rewritten gets a
  new cache, never the stale one."""
  h = hashlib.sha256(f"{FORMAT}|{text_field}|".encode())
  h.update(tokenizer.to_json().encode("utf-8"))
  common = pathlib.Path(os.path.commonpath([str(f.resolve()) for f in files]))
  for f in files:
    stat = f.stat()
    name = f.resolve().relative_to(common).as_posix() if len(files) > 1 else f.name
    sample = _content_sample(f, stat.st_size)
    h.update(f"{name}|{stat.st_size}|{stat.st_mtime_ns}|{sample}|".encode())
  return h.hexdigest()[:20]


def _file_crc(path: pathlib.Path) -> int:
  """CRC-32 of a file read in chunks (never mapped, so it adds nothing to resident memory)."""
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(8 << 20):
      crc = zlib.crc32(chunk, crc)
  return crc


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
  """Write `data` to a temporary file beside `path`, then rename it. A write that fails (a
  full disk, a quota) removes the partial file and names the folder and the fix."""
  tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    raise DataError(
        f"{e.strerror or e} ({path}, {len(data):,} bytes of the token cache): free space in "
        f"{path.parent}, or set --config.data.cache_dir to a folder with room"
    ) from None


def _encode(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
  if tokenizer.kind == "byte":  # UTF-8 bytes are the ids: no Python list per byte
    return [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
  return [np.asarray(ids, np.int64) for ids in tokenizer.encode_batch(texts)]


def _split_lines(text: str, size: int = 1 << 16) -> list[str]:
  """A long text cut after newlines into pieces of about `size` characters (a BPE encodes a
  batch of pieces on all its threads; cut at line ends, the pieces tokenize as the whole)."""
  if len(text) <= size:
    return [text]
  pieces, start = [], 0
  while start < len(text):
    cut = text.find("\n", start + size)
    end = len(text) if cut < 0 else cut + 1
    pieces.append(text[start:end])
    start = end
  return pieces


_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer_json: str) -> None:
  global _WORKER_TOKENIZER
  _WORKER_TOKENIZER = load_tokenizer_json(tokenizer_json)


def _tokenize_unit(args) -> dict:
  """Tokenize one unit into its shard files and write its record last; returns the record."""
  index, unit, folder, text_field, vocab_size = args
  tok = _WORKER_TOKENIZER
  folder = pathlib.Path(folder)
  dtype = token_dtype(vocab_size)
  sep = None if tok.eos_id is not None else np.asarray(tok.encode(TEXT_SEPARATOR), np.int64)
  pieces, ends, count, source_bytes, separators = [], [], 0, 0, 0
  texts, flags = [], []

  def flush():
    nonlocal count, separators
    for ids, ends_doc in zip(_encode(tok, texts), flags):
      if ids.size and int(ids.max()) >= vocab_size:
        raise DataError(
            f"token id {int(ids.max())} is outside [0, vocab_size={vocab_size}) for the "
            f"{tok.kind} tokenizer (vocab {tok.vocab_size}): set --config.model.vocab_size to "
            f"at least {tok.vocab_size}"
        )
      pieces.append(ids.astype(dtype, copy=False))  # stored as they will be written
      count += len(ids)
      if ends_doc and count > (ends[-1] if ends else 0):  # an empty document adds nothing
        extra = (np.asarray([tok.eos_id]) if sep is None else sep).astype(dtype)
        pieces.append(extra)
        count += len(extra)
        separators += len(extra)
        ends.append(count)
    texts.clear()
    flags.clear()

  for text, ends_doc in sources.read_unit(unit, text_field):
    source_bytes += len(text.encode("utf-8")) if tok.kind != "byte" else 0
    if unit.kind == "txt" and tok.kind != "byte":
      parts = _split_lines(text)
      texts.extend(parts)
      flags.extend([False] * (len(parts) - 1) + [ends_doc])
    else:
      texts.append(text)
      flags.append(ends_doc)
    if len(texts) >= 1024:
      flush()
  flush()
  ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
  if tok.kind == "byte":
    source_bytes = count - separators
  tokens = ids.tobytes()
  docs = np.asarray(ends, np.uint64).tobytes()
  stem = folder / f"{index:05d}"
  _write_atomic(stem.with_suffix(".tokens"), tokens)
  _write_atomic(stem.with_suffix(".docs"), docs)
  record = {
      "index": index,
      "tokens": int(ids.size),
      "documents": len(ends),
      "source_bytes": int(source_bytes),
      "tokens_crc": zlib.crc32(tokens),
      "docs_crc": zlib.crc32(docs),
  }
  _write_atomic(stem.with_suffix(".json"), json.dumps(record).encode())
  return record


def _shard_ok(folder: pathlib.Path, record: dict, dtype: np.dtype, checksums: bool) -> str:
  """'' if the shard's files match `record`, else what is wrong with them."""
  stem = folder / f"{record['index']:05d}"
  for suffix, size, crc in (
      (".tokens", record["tokens"] * dtype.itemsize, record["tokens_crc"]),
      (".docs", record["documents"] * 8, record["docs_crc"]),
  ):
    path = stem.with_suffix(suffix)
    if not path.exists():
      return f"{path.name} is missing"
    if path.stat().st_size != size:
      return f"{path.name} has {path.stat().st_size} bytes, not {size}"
    if checksums and _file_crc(path) != crc:
      return f"{path.name} fails its checksum"
  return ""


@dataclasses.dataclass
class TokenCache:
  """A complete cache: its folder, token dtype and one record per shard (in source order)."""

  folder: pathlib.Path
  dtype: np.dtype
  shards: list[dict]

  @property
  def num_tokens(self) -> int:
    return sum(s["tokens"] for s in self.shards)

  @property
  def source_bytes(self) -> int:
    return sum(s["source_bytes"] for s in self.shards)

  def tokens_path(self, i: int) -> pathlib.Path:
    return self.folder / f"{i:05d}.tokens"

  def docs(self, i: int) -> np.ndarray:
    return np.fromfile(self.folder / f"{i:05d}.docs", np.uint64)


def build_cache(
    path: str | os.PathLike,
    tokenizer: Tokenizer,
    root: str | os.PathLike,
    vocab_size: int,
    workers: int = 1,
    text_field: str = "text",
    unit_bytes: int = sources.UNIT_BYTES,
    progress: bool | None = None,
    log=None,
    split: str = "train",
    field: str = "data.path",
) -> TokenCache:
  """The token cache of the source at `path` under `root`, built (or completed, or repaired)
  with `workers` processes if needed. `progress`: a tqdm bar (None = only on a terminal);
  `split`: the split of a Hugging Face dataset folder; `field`: the setting that names `path`,
  for messages."""
  log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
  files = sources.list_files(path, split, field)
  folder = pathlib.Path(root) / cache_key(files, tokenizer, text_field)
  folder.mkdir(parents=True, exist_ok=True)
  dtype = token_dtype(vocab_size)
  manifest_path = folder / "manifest.json"
  units = sources.plan_units(files, unit_bytes, text_field)
  records: dict[int, dict] = {}
  try:
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT or len(manifest["shards"]) != len(units):
      raise ValueError("another layout")
    for rec in manifest["shards"]:
      problem = _shard_ok(folder, rec, dtype, checksums=True)
      if problem:
        log(f"token cache {folder}: {problem}; tokenizing that shard again")
        (folder / f"{rec['index']:05d}.json").unlink(missing_ok=True)
      else:
        records[rec["index"]] = rec
    if len(records) == len(units):
      return TokenCache(folder, dtype, [records[i] for i in range(len(units))])
  except (OSError, ValueError, KeyError, TypeError):
    pass
  manifest_path.unlink(missing_ok=True)
  # Shards an interrupted build finished: their record is written after their files.
  for i in range(len(units)):
    if i in records:
      continue
    try:
      rec = json.loads((folder / f"{i:05d}.json").read_text())
      if rec.get("index") == i and not _shard_ok(folder, rec, dtype, checksums=True):
        records[i] = rec
    except (OSError, ValueError, KeyError, TypeError):
      pass
  todo = [i for i in range(len(units)) if i not in records]
  if records and todo:
    log(f"token cache {folder}: resuming, {len(records)} of {len(units)} shards done")
  total_bytes = sum(max(units[i].end - units[i].start, 0) for i in todo)
  bar = None
  if progress or (progress is None and sys.stderr.isatty()):
    from tqdm import tqdm

    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", leave=False)
  jobs = [(i, units[i], str(folder), text_field, vocab_size) for i in todo]
  try:
    if workers <= 1 or len(jobs) <= 1:
      _init_worker(tokenizer.to_json())
      for job in jobs:
        records[job[0]] = _tokenize_unit(job)
        if bar is not None:
          bar.update(max(job[1].end - job[1].start, 0))
    else:
      context = multiprocessing.get_context("spawn")  # no fork of a process running JAX
      with concurrent.futures.ProcessPoolExecutor(
          workers, mp_context=context, initializer=_init_worker, initargs=(tokenizer.to_json(),)
      ) as pool:
        futures = {pool.submit(_tokenize_unit, job): job for job in jobs}
        for fut in concurrent.futures.as_completed(futures):
          job = futures[fut]
          records[job[0]] = fut.result()
          if bar is not None:
            bar.update(max(job[1].end - job[1].start, 0))
  finally:
    if bar is not None:
      bar.close()
  shards = [records[i] for i in range(len(units))]
  if not any(s["tokens"] for s in shards):
    raise DataError(
        f"the text at {field} '{path}' is empty: pass non-empty .txt, .jsonl, .parquet or "
        ".arrow files"
    )
  manifest = {"format": FORMAT, "dtype": dtype.name, "vocab_size": vocab_size, "shards": shards}
  _write_atomic(manifest_path, json.dumps(manifest, indent=1).encode())
  return TokenCache(folder, dtype, shards)
