"""The run folder's JSON records read with one-line errors naming the file: config.json (one
object) and run_history.jsonl (one object per line), and how every process writes a record.
It sits in the bottom layer, beside errors.py: the tokenizers, the objectives, the training
config and the run folder all read or write these records."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Mapping

from transformers_jax.errors import RunError


def read_config(path: pathlib.Path) -> dict | None:
  """config.json as a dict, or None when there is none."""
  if not path.is_file():
    return None
  try:
    saved = json.loads(path.read_text())
  except ValueError as e:
    raise RunError(f"{path} is not valid JSON ({e}): restore the run's config") from None
  if not isinstance(saved, dict):
    raise RunError(f"{path} is not a run config (a JSON object): restore the run's config")
  if not isinstance(saved.get("model"), dict):
    what = (
        f"a Hugging Face model's config.json (model_type {saved['model_type']!r}), not a run of "
        "this project: give the run's --workdir, or convert it with python -m "
        "transformers_jax.convert --from_hf"
        if "model_type" in saved
        else "not a run config (it has no 'model' object): restore the run's config, or use a "
        "new --workdir"
    )
    raise RunError(f"{path} is {what}")
  return saved


def asks_for_population(population) -> bool:
  """Whether population settings (a config's, or config.json's dict of them) ask for a
  population: seeds > 0, or any list set."""
  fields = {} if population is None else dict(getattr(population, "to_dict", lambda: population)())
  return bool(fields.get("seeds")) or any(str(v).strip() for k, v in fields.items() if k != "seeds")


def read_history(path: pathlib.Path) -> list[dict]:
  """run_history.jsonl's entries ([] when there is none)."""
  if not path.is_file():
    return []
  entries = []
  for number, line in enumerate(path.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      entry = json.loads(line)
    except ValueError as e:
      entry = e
    if not isinstance(entry, dict) or not isinstance(entry.get("changes", {}), dict):
      raise RunError(
          f"{path}: line {number} is not a recorded change ({str(entry)[:80]}): restore the "
          "file, or delete the line (the run's settings then come from config.json and the "
          "lines before)"
      )
    entries.append(entry)
  return entries


def write_text_atomically(path, text: str) -> None:
  """Writes `path` so that a reader sees either the old file (or none) or all of `text`, never
  a part: the processes of a multi-process run each write the same records into one run folder
  and read them back, and a reader racing a plain write_text reads a truncated file."""
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def flatten_dict(d: Mapping, prefix: str = "") -> dict:
  """A nested mapping as {dotted.name: leaf value}."""
  out = {}
  for key, value in d.items():
    if isinstance(value, Mapping):
      out.update(flatten_dict(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out
