"""What the sweep scripts (lr_sensitivity.py and the scripts that read its sweep files) share:
loading a sweep file, the config of one of its entries, and the OUT/*.jsonl file of finished
entries that makes a rerun skip them; and what every long script shares: a progress line per
finished row (RowProgress)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_sweep(path, required: tuple[str, ...]):
  """The sweep file at `path` as a module (with `.path` set); it must define `required`, e.g.
  ("BASE", "points") (the last one named as a function of `scale`)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"--sweep {path}: no such file")
  spec = importlib.util.spec_from_file_location(f"sweep_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not all(hasattr(module, name) for name in required):
    *names, entries = required
    raise ValueError(
        f"--sweep {path}: a sweep file defines {', '.join(names)} and {entries}(scale)"
        if names
        else f"--sweep {path}: a sweep file defines {entries}(scale)"
    )
  module.path = path
  return module


def base_config(sweep, base: str | None = None):
  """The sweep's BASE `<file>:<preset>` (or an entry's own `base`), the file found beside the
  sweep or in experiments/."""
  from transformers_jax.config import load_config_module

  base = base or sweep.BASE
  file, _, preset = base.partition(":")
  for folder in (sweep.path.parent, ROOT / "experiments"):
    if (folder / file).is_file():
      return load_config_module(str(folder / file)).get_config(preset or None)
  raise FileNotFoundError(f"BASE={base!r}: {file} is neither beside the sweep nor in experiments/")


def entry_config(sweep, entry: dict, out: pathlib.Path, kind: str = "point"):
  """The entry's config: BASE (or the entry's own `base`, a sweep that mixes tasks) with its
  overrides, each of which must name an existing field with a value of that field's type (a
  typo is an error, never a new field); tokens are cached in OUT/data, shared by every
  entry."""
  config = base_config(sweep, entry.get("base"))
  config.lock()
  for key, value in entry["overrides"].items():
    try:
      config.update_from_flattened_dict({key: value})
    except (AttributeError, KeyError):
      raise ValueError(
          f"--sweep {sweep.path}: {kind} {entry['name']!r} overrides {key!r}, which "
          "is not a config field: fix the name"
      ) from None
    except TypeError as e:
      raise ValueError(
          f"--sweep {sweep.path}: {kind} {entry['name']!r} sets {key}={value!r}: {e}"
      ) from None
  config.data.cache_dir = str(out / "data")
  return config


def check_entries(sweep, entries: list[dict], kind: str, limit_flag: str, limit: int) -> None:
  """Entry names are unique (they name the run folders and the finished records) and the
  --max_<kind>s limit is not negative."""
  names = [e["name"] for e in entries]
  if len(set(names)) != len(names):
    raise ValueError(f"--sweep {sweep.path}: {kind} names repeat")
  if limit < 0:
    raise ValueError(f"--{limit_flag}={limit}: give 0 (all) or a positive number")


def read_records(path: pathlib.Path) -> dict[str, dict]:
  """{name: record} of the finished entries in a .jsonl file (a line cut short by a kill is
  skipped: that entry runs again)."""
  records = {}
  if path.exists():
    for line in path.read_text().splitlines():
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if isinstance(row, dict) and "name" in row:
        records[row["name"]] = row
  return records


def append_record(path: pathlib.Path, record: dict) -> None:
  """Add a finished entry's line, on disk before the next entry starts."""
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def clock(seconds: float) -> str:
  """Seconds as 1h02m, 3m05s or 42s."""
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class RowProgress:
  """A long script's progress as it goes, on stderr so that its stdout stays its results (JSON,
  markdown): "[3/12] NAME ..." when a row starts and "[3/12] NAME: WHAT (took 40s) | 2m01s
  elapsed, ~6m40s left" when it ends. The estimate scales the time of the rows done so far by
  the `work` each row is given (equal by default; 0: not counted, e.g. a warm-up)."""

  def __init__(self, work: list[float], stream=None):
    self.work, self.stream = list(work), stream or sys.stderr
    self.index, self.t0 = 0, time.perf_counter()
    self.row_t0, self.counted_s = self.t0, 0.0

  def start(self, name: str) -> None:
    self.row_t0 = time.perf_counter()
    self._say(f"[{self.index + 1}/{len(self.work)}] {name} ...")

  def finish(self, name: str, said: str = "") -> None:
    now = time.perf_counter()
    took = now - self.row_t0
    if self.work[self.index]:
      self.counted_s += took
    done_work = sum(self.work[: self.index + 1])
    left = sum(self.work[self.index + 1 :]) * self.counted_s / done_work if done_work else None
    self.index += 1
    text = f"[{self.index}/{len(self.work)}] {name}{': ' + said if said else ' done'}"
    text += f" (took {clock(took)})"
    text += f" | {clock(now - self.t0)} elapsed"
    if left is not None and self.index < len(self.work):
      text += f", ~{clock(left)} left"
    self._say(text)

  def _say(self, text: str) -> None:
    print(text, file=self.stream, flush=True)
