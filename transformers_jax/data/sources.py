"""Text sources of any size, read in chunks: .txt files or folders, .jsonl, .parquet and .arrow
files, and Hugging Face dataset folders (save_to_disk, or shards as the hub lays them out:
hf_datasets.py).

A source is cut into *units* (a byte range of a .txt / .jsonl file, a few row groups of a
.parquet file, or a row range of an .arrow file) that can be read and tokenized independently,
in any order and in parallel. A unit owns the lines that start inside its byte range, so every
line is read exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterator

from transformers_jax.data import hf_datasets
from transformers_jax.data.errors import DataError

SUFFIXES = (".txt", ".jsonl", ".parquet", ".arrow")
# Bytes of text per unit: large enough that per-unit overhead vanishes, small enough to spread
# a corpus over worker processes and to bound what one worker holds in memory.
UNIT_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class Unit:
  """One independently readable piece of a source file: bytes [start, end) of a text or JSONL
  file, row groups [start, end) of a Parquet file or rows [start, end) of an Arrow file; `last`
  when it holds the file's end."""

  path: str
  kind: str  # txt | jsonl | parquet | arrow
  start: int
  end: int
  last: bool


def list_files(
    path: str | os.PathLike, split: str = "train", field: str = "data.path"
) -> list[pathlib.Path]:
  """The files of the source at `path`: a .txt / .jsonl / .parquet / .arrow file, the .arrow
  files of a save_to_disk folder (of its `split`, for a DatasetDict), the shards of `split` in a
  folder of .parquet / .arrow files (the hub's layout), or else every .txt / .jsonl file of a
  folder, searched recursively. `field` names the setting in messages."""
  root = pathlib.Path(path)
  fix = (
      f"pass a .txt, .jsonl, .parquet or .arrow file, a folder of them or a Hugging Face "
      f"dataset folder, with --config.{field.split(' ')[0]}"
  )
  if not root.exists():
    raise DataError(f"{field} '{root}' does not exist: {fix}")
  if root.is_file():
    if root.suffix not in SUFFIXES:
      raise DataError(f"{field} '{root}' is not a .txt, .jsonl, .parquet or .arrow file: {fix}")
    return [root]
  if hf_datasets.is_saved_folder(root):
    return hf_datasets.saved_files(root, split, field)
  files = sorted(f for f in root.rglob("*") if f.suffix in SUFFIXES and f.is_file())
  if not files:
    raise DataError(
        f"{field} '{root}' holds no .txt, .jsonl or .parquet files, nor .arrow shards: {fix}"
    )
  if any(f.suffix in hf_datasets.SHARD_SUFFIXES for f in files):  # the hub's layout: one split
    return hf_datasets.hub_split_files(root, split, field, SUFFIXES)
  return files


def without_splits(path: str | os.PathLike, field: str = "data.path") -> str | None:
  """What the source at `path` is when nothing in it divides it into splits (data.split then
  has nothing to choose): a file, a Dataset saved with save_to_disk, a folder of .txt / .jsonl
  files or a folder of shards whose names name no split; None for a DatasetDict, a folder of
  shards named by split, or a path that does not exist (reading it says so)."""
  root = pathlib.Path(path)
  if not root.exists():
    return None
  if root.is_file():
    return "one file"
  if hf_datasets.is_saved_folder(root):
    if (root / "dataset_dict.json").is_file():
      return None
    return "a Dataset saved with save_to_disk (not a DatasetDict)"
  files = [f for f in root.rglob("*") if f.suffix in SUFFIXES and f.is_file()]
  if not any(f.suffix in hf_datasets.SHARD_SUFFIXES for f in files):
    return "a folder of .txt / .jsonl files" if files else None
  if hf_datasets.shard_names_name_splits(root, field):
    return None
  return "a folder of shards whose file and folder names name no split"


def plan_units(
    files: list[pathlib.Path], unit_bytes: int = UNIT_BYTES, text_field: str = "text"
) -> list[Unit]:
  """Every file cut into units of about `unit_bytes` (Parquet: whole row groups; Arrow: rows
  holding about that many bytes of the file). `text_field`: checked in an Arrow file's schema."""
  units = []
  for f in files:
    kind = f.suffix[1:]
    if kind == "arrow":
      for a, b, last in hf_datasets.arrow_row_ranges(f, unit_bytes, text_field):
        units.append(Unit(str(f), kind, a, b, last))
      continue
    if kind == "parquet":
      meta = _parquet_file(f).metadata
      groups, size, first = meta.num_row_groups, 0, 0
      for g in range(groups):
        size += meta.row_group(g).total_byte_size
        if size >= unit_bytes or g == groups - 1:
          units.append(Unit(str(f), kind, first, g + 1, g == groups - 1))
          first, size = g + 1, 0
      continue
    total = f.stat().st_size
    edges = list(range(0, total, unit_bytes)) + [total]
    if total == 0:
      edges = [0, 0]
    for a, b in zip(edges[:-1], edges[1:]):
      units.append(Unit(str(f), kind, a, b, b == total))
  return units


def _parquet_file(path):
  try:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path)
  except ImportError as e:  # pragma: no cover - pyarrow is a dependency
    raise DataError("reading .parquet needs pyarrow: pip install pyarrow") from e
  except Exception as e:  # pyarrow raises its own error types for unreadable files
    raise DataError(f"'{path}' is not a readable Parquet file ({e}): check the file") from e


def _line_range(unit: Unit) -> bytes:
  """The bytes of the whole lines that start in [unit.start, unit.end)."""
  with open(unit.path, "rb") as f:
    if unit.start > 0:
      f.seek(unit.start - 1)
      f.readline()  # the rest of the line that started before this unit
    begin = f.tell()
    if begin >= unit.end and unit.start > 0:
      return b""
    data = f.read(max(unit.end - begin, 0))
    if data and not data.endswith(b"\n"):
      data += f.readline()  # finish the last line started in this unit
  return data


def _decode(data: bytes, unit: Unit) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(
        f"'{unit.path}' is not valid UTF-8 ({e.reason} at byte {unit.start + e.start}): "
        "re-encode it as UTF-8"
    ) from e


# text_field that makes read_unit yield each JSONL row whole, as its line of JSON (the chat
# objective's rows: messages, not one text field)
WHOLE_ROW = "*"


def read_unit(unit: Unit, text_field: str = "text") -> Iterator[tuple[str, bool]]:
  """(text, ends_document) pieces of a unit in order. A .txt file is one document, read in
  pieces; each JSONL line and each Parquet or Arrow row is one document."""
  if unit.kind == "txt":
    text = _decode(_line_range(unit), unit)
    yield text, unit.last
  elif unit.kind == "jsonl":
    data = _line_range(unit)
    for number, line in enumerate(data.splitlines()):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError as e:
        raise DataError(
            f"'{unit.path}': line {number + 1} after byte {unit.start} is not JSON ({e}): "
            "write one JSON object per line"
        ) from None
      if text_field == WHOLE_ROW and isinstance(row, dict):  # the row itself (a conversation)
        yield line.decode("utf-8", errors="replace"), True
        continue
      if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
        raise DataError(
            f"'{unit.path}': a line after byte {unit.start} has no string field "
            f"'{text_field}': set --config.data.text_field to the field holding the text"
        )
      yield row[text_field], True
  elif unit.kind == "parquet":
    pf = _parquet_file(unit.path)
    if text_field not in pf.schema_arrow.names:
      raise DataError(
          f"'{unit.path}' has no column '{text_field}' (columns: "
          f"{', '.join(pf.schema_arrow.names)}): set --config.data.text_field"
      )
    kind = pf.schema_arrow.field(text_field).type
    if str(kind) not in ("string", "large_string", "string_view"):
      raise DataError(
          f"'{unit.path}': column '{text_field}' holds {kind}, not text: set "
          "--config.data.text_field to a column of strings"
      )
    for g in range(unit.start, unit.end):
      column = pf.read_row_group(g, columns=[text_field]).column(0)
      for text in column.to_pylist():
        if text:
          yield str(text), True
  elif unit.kind == "arrow":
    for text in hf_datasets.read_arrow_rows(unit.path, unit.start, unit.end, text_field):
      yield text, True
  else:
    raise DataError(f"unknown source kind {unit.kind!r}")


def sample_texts(files: list[pathlib.Path], text_field: str, max_bytes: int) -> list[str]:
  """Documents from the start of the source, about `max_bytes` of them (to train a BPE)."""
  out, size = [], 0
  for unit in plan_units(files, min(max_bytes, UNIT_BYTES), text_field):
    for text, _ in read_unit(unit, text_field):
      out.append(text)
      size += len(text)
      if size >= max_bytes:
        return out
  return out
