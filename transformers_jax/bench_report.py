"""What the benchmark scripts share when they report: the config named as the project's own
relative path, and the result printed as JSON (and written to --out when given)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
