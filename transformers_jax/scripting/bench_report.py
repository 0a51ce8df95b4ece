"""What the benchmark scripts share when they report: the config named as the project's own
relative path, and the result printed as JSON (and written to --out when given)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def shown(config: str) -> str:
  """`<file>[:<preset>]` with the file relative to the project where it is one of its files."""
  file, sep, preset = config.partition(":")
  path = pathlib.Path(file).resolve()
  if path.is_relative_to(ROOT):
    return str(path.relative_to(ROOT)) + sep + preset
  return config


def print_json(result: dict, out: str = "") -> None:
  """Print `result` as indented JSON, and write it to the file `out` too when one is named."""
  text = json.dumps(result, indent=1)
  print(text)
  if out:
    pathlib.Path(out).write_text(text + "\n")


def print_report(report: dict, table: str, out: str = "") -> None:
  """Print `report` as indented JSON on stdout and its markdown `table` on stderr; with `out`,
  write the JSON there and the table beside it (the same name, .md)."""
  text = json.dumps(report, indent=1)
  print(text)
  print(table, file=sys.stderr)
  if out:
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    path.with_suffix(".md").write_text(table + "\n")


def compile_only(args: list[str], timeout_s: float) -> dict:
  """Runs `python -m transformers_jax.train --compile_only ARGS` in a subprocess (a compile for a
  TPU topology holds gigabytes that end with it) and returns its command, exit code and wall
  time with the JSON report it printed, or an "error" (its last stderr line) when it printed
  none; only {"error": ...} when it ran past `timeout_s`."""
  cmd = [sys.executable, "-m", "transformers_jax.train", "--compile_only", *args]
  start = time.perf_counter()
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return {"error": f"compile took over {timeout_s} s"}
  out = {
      "command": "python -m transformers_jax.train --compile_only " + " ".join(args),
      "exit_code": done.returncode,
      "wall_s": round(time.perf_counter() - start, 1),
  }
  text = done.stdout.strip()
  if text.startswith("{"):
    out.update(json.loads(text))
  else:
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    out["error"] = last.removeprefix("error: ")[:400]
  return out


def compile_table(
    rows, compile_row, out, only, redo: bool, markdown, summary, name: str = "tpu"
) -> list[dict]:
  """The driver of the compile tables (scripts/plan_scale.py, scripts/moe_capacity.py): each row
  of `rows` (dicts with a "name") that `only` selects (substrings of names; empty: all) and
  OUT/<name>.json does not hold yet (or every selected one with `redo`) is compiled by
  `compile_row(row) -> result`, with progress and `summary(result)` on stderr; <name>.json and
  <name>.md are rewritten after each row, so a stopped run keeps what it compiled. Returns the
  results in the order of `rows`."""
  from transformers_jax.scripting.sweeps import RowProgress

  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  path = out / f"{name}.json"
  done = {r["name"]: r for r in json.loads(path.read_text())} if path.exists() else {}
  todo = [
      r
      for r in rows
      if (not only or any(text in r["name"] for text in only)) and (r["name"] not in done or redo)
  ]
  ordered = [done[r["name"]] for r in rows if r["name"] in done]
  progress = RowProgress([1] * len(todo))  # on stderr: stdout is the table
  for r in todo:
    progress.start(f"compiling {r['name']}")
    done[r["name"]] = compile_row(r)
    progress.finish(r["name"], summary(done[r["name"]]))
    ordered = [done[x["name"]] for x in rows if x["name"] in done]
    path.write_text(json.dumps(ordered, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(ordered))
  (out / f"{name}.md").write_text(markdown(ordered))
  return ordered
