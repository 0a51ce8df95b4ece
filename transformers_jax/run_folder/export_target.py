"""Where `convert --to_hf` may write: never into a run's own folder (or one inside or around it),
nor over a folder that holds another run or other files unless asked."""

from __future__ import annotations

import json
import pathlib

from transformers_jax.errors import UserError


def check_export_target(run: pathlib.Path, target: pathlib.Path, overwrite: bool) -> None:
  """Refuse a --to_hf folder that is the run itself (or inside it, or holding it), or that
  already holds files unless `overwrite`: a Hugging Face export writes config.json, which
  would replace a run's own."""
  run, target = run.resolve(), target.resolve()
  if target == run or run in target.parents or target in run.parents:
    raise UserError(
        f"--to_hf {target} is the run's own folder (or contains or lies in "
        f"it): export into a separate folder"
    )
  if target.exists() and not target.is_dir():
    raise UserError(f"--to_hf {target} is a file: give a folder")
  held = run_files(target)
  if held:
    raise UserError(
        f"--to_hf {target} holds a run of this project ({held}): --overwrite never replaces "
        "a run's files; export into another folder"
    )
  if target.is_dir() and any(target.iterdir()) and not overwrite:
    raise UserError(
        f"--to_hf {target} already holds files: give an empty or new folder, "
        "or pass --overwrite to replace them"
    )


def run_files(folder: pathlib.Path) -> str:
  """What marks `folder` as a run of this project (a config.json with a model, checkpoints,
  a run history), or ''."""
  if not folder.is_dir():
    return ""
  found = [name for name in ("checkpoints", "run_history.jsonl") if (folder / name).exists()]
  try:
    saved = json.loads((folder / "config.json").read_text())
    if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
      found.insert(0, "config.json with a model")
  except (OSError, ValueError):  # none, or not JSON: not a run's config
    pass
  return ", ".join(found)
