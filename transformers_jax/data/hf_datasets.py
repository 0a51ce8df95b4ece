"""Hugging Face `datasets` folders as text sources, read through the `datasets` package (the
`hf_data` extra), memory-mapped and one row range at a time: nothing loads a whole set.

- A folder written by `Dataset.save_to_disk` (state.json, data-*.arrow): its Arrow files, in
  order; one written by `DatasetDict.save_to_disk` (dataset_dict.json): those of one split.
- A folder of .parquet or .arrow shards as the hub lays them out (`data/train-00000-of-00002
  .parquet`, `train/0000.parquet`, ...): the shards of one split, chosen by `datasets`' own rules
  for split names in file and folder names (a folder without split names is all "train").
- One .arrow file (the streaming Arrow layout `datasets` writes).

This module tells which files a folder holds and reads rows of an .arrow file; sources.py cuts
them into units and reads .parquet shards itself (pyarrow, a core dependency).
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterator

from transformers_jax.data.errors import DataError

INSTALL = "pip install 'transformers_jax[hf_data]'"
# The suffixes of the hub's shards that a folder of them may hold (.txt and .jsonl read as ever).
SHARD_SUFFIXES = (".parquet", ".arrow")
# Rows converted to Python strings at once while reading a unit (bounds what a read holds).
READ_ROWS = 1024


def require_datasets(what: str):
  """The `datasets` module, or one line saying that `what` needs it and how to install it."""
  try:
    import datasets
  except ImportError:
    raise DataError(
        f"{what} is read with the Hugging Face `datasets` package, which is not installed: "
        f"{INSTALL}"
    ) from None
  return datasets


def is_saved_folder(root: pathlib.Path) -> bool:
  """Whether `root` was written by save_to_disk (a Dataset or a DatasetDict)."""
  return (root / "state.json").is_file() or (root / "dataset_dict.json").is_file()


def shard_names_name_splits(root: pathlib.Path, field: str) -> bool:
  """Whether the file and folder names of a folder of shards name splits, by `datasets`' rules
  (`data/train-00000-of-00002.parquet`, `test/0000.parquet`); a folder whose names name none is
  all "train"."""
  require_datasets(f"{field} '{root}' (a folder of .parquet / .arrow shards, split by name)")
  from datasets.data_files import DEFAULT_PATTERNS_ALL, get_data_patterns

  try:
    return get_data_patterns(str(root)) != DEFAULT_PATTERNS_ALL
  except Exception:  # noqa: BLE001 - no data files: hub_split_files says so when it reads them
    return True


def saved_files(root: pathlib.Path, split: str, field: str) -> list[pathlib.Path]:
  """The .arrow files of a save_to_disk folder, in the dataset's order: a Dataset's own, or
  those of `split` of a DatasetDict."""
  datasets = require_datasets(f"{field} '{root}' (a Hugging Face dataset saved with save_to_disk)")
  try:
    saved = datasets.load_from_disk(str(root))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(
        f"{field} '{root}' looks like a save_to_disk folder but `datasets` cannot load it "
        f"({type(e).__name__}: {e}): save it again with save_to_disk"
    ) from None
  if isinstance(saved, datasets.DatasetDict):
    if split not in saved:
      raise DataError(
          f"{field} '{root}' holds the splits {', '.join(saved)}, not '{split}': set "
          "--config.data.split to one of them"
      )
    saved = saved[split]
  files = [pathlib.Path(f["filename"]) for f in saved.cache_files]
  if not files:  # a dataset held in memory only has no files to stream
    raise DataError(f"{field} '{root}' holds no .arrow files: save the dataset with save_to_disk")
  return files


def hub_split_files(root: pathlib.Path, split: str, field: str, suffixes) -> list[pathlib.Path]:
  """The files (with one of `suffixes`) of `split` in a folder laid out as the hub lays out a
  dataset, the split told by `datasets`' rules for file and folder names."""
  require_datasets(f"{field} '{root}' (a folder of .parquet / .arrow shards, split by name)")
  from datasets.data_files import DataFilesDict, get_data_patterns

  try:
    found = DataFilesDict.from_patterns(get_data_patterns(str(root)), str(root))
  except Exception as e:  # datasets raises its own types (EmptyDatasetError, ...)  # noqa: BLE001
    raise DataError(
        f"{field} '{root}': `datasets` finds no data files in it ({type(e).__name__}): "
        "give a folder of .parquet or .arrow shards"
    ) from None
  splits = {str(name): files for name, files in found.items()}
  if split not in splits and not shard_names_name_splits(root, field):
    raise DataError(
        f"{field} '{root}': its file and folder names name no split (`datasets` reads every "
        f"file as 'train'), so there is no split '{split}': leave data.split at 'train', or "
        "name the files by split (data/train-00000-of-00001.parquet, data/test-...)"
    )
  if split not in splits:
    raise DataError(
        f"{field} '{root}' holds the splits {', '.join(splits)}, not '{split}': set "
        "--config.data.split to one of them"
    )
  files = sorted({pathlib.Path(f) for f in splits[split] if pathlib.Path(f).suffix in suffixes})
  if not files:
    raise DataError(
        f"{field} '{root}': split '{split}' holds no {', '.join(suffixes)} files: give a "
        "folder of such shards"
    )
  return files


def _open(path: str):
  """The memory-mapped `datasets.Dataset` of one .arrow file (mapped, not read)."""
  datasets = require_datasets(f"'{path}' (an .arrow file)")
  try:
    return datasets.Dataset.from_file(str(path), in_memory=False)
  except Exception as e:  # pyarrow's and datasets' own error types  # noqa: BLE001
    raise DataError(
        f"'{path}' is not a readable Arrow file of a Hugging Face dataset ({e}): check the file"
    ) from None


def check_text_column(path: str, dataset, text_field: str) -> None:
  """A column `text_field` of strings, or one line naming the columns there are."""
  if text_field not in dataset.column_names:
    raise DataError(
        f"'{path}' has no column '{text_field}' (columns: {', '.join(dataset.column_names)}): "
        "set --config.data.text_field"
    )
  kind = getattr(dataset.features[text_field], "dtype", dataset.features[text_field])
  if str(kind) not in ("string", "large_string", "string_view"):
    raise DataError(
        f"'{path}': column '{text_field}' holds {kind}, not text: set --config.data.text_field "
        "to a column of strings"
    )


def arrow_row_ranges(path: pathlib.Path, unit_bytes: int, text_field: str) -> list[tuple]:
  """Rows [start, end) of an .arrow file cut into ranges of about `unit_bytes` of the file,
  each with a flag for the last; the text column is checked here, before any is read."""
  dataset = _open(str(path))
  check_text_column(str(path), dataset, text_field)
  rows = len(dataset)
  per_range = max(1, math.ceil(rows * unit_bytes / max(path.stat().st_size, 1)))
  edges = list(range(0, rows, per_range)) + [rows]
  if rows == 0:
    edges = [0, 0]
  return [(a, b, b == rows) for a, b in zip(edges[:-1], edges[1:])]


def read_arrow_rows(path: str, start: int, end: int, text_field: str) -> Iterator[str]:
  """The texts of rows [start, end) of an .arrow file, READ_ROWS at a time (empty ones left
  out). The file's mapping is released when the reading ends."""
  dataset = _open(path)
  check_text_column(path, dataset, text_field)
  table = dataset.with_format("arrow")
  for a in range(start, end, READ_ROWS):
    column = table[a : min(a + READ_ROWS, end)][text_field]
    for text in column.to_pylist():
      if text:
        yield str(text)
