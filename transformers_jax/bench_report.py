"""What the benchmark scripts share when they report: the config named as the project's own
relative path, and the result printed as JSON (and written to --out when given)."""

from __future__ import annotations

import json
import pathlib

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
