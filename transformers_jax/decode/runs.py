"""Loading a training run for decoding: its model config, latest (or chosen) checkpoint's
parameters and tokenizer. Mistakes raise cli.UserError (one line from a command line)."""

from __future__ import annotations

import json
import pathlib

from transformers_jax import cli


def parse_ids(text: str, flag: str) -> list[int]:
  try:
    return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
  except ValueError:
    raise cli.UserError(f"--{flag}={text!r}: give comma-separated integers, e.g. 1,2,3") from None


def load_run(workdir, step: int | None = None):
  """(ModelConfig, params, tokenizer or None, step) of a training run's checkpoint."""
  from transformers_jax.config import ModelConfig
  from transformers_jax.data import load_tokenizer
  from transformers_jax.train.checkpoint import Checkpoints

  workdir = pathlib.Path(workdir)
  config_path = workdir / "config.json"
  if not config_path.is_file():
    raise cli.UserError(f"{workdir} has no config.json: pass the --workdir of a training run")
  cfg = ModelConfig.from_dict(json.loads(config_path.read_text())["model"])
  ckpt_dir = workdir / "checkpoints"
  steps = sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()) \
      if ckpt_dir.is_dir() else []
  if not steps:
    raise cli.UserError(f"{workdir} has no checkpoint yet: train it first "
                        "(python -m transformers_jax.train --workdir ...)")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise cli.UserError(f"--step={step}: {workdir} has checkpoints at steps "
                        f"{', '.join(map(str, steps))}")
  manager = Checkpoints(ckpt_dir, async_save=False)
  params = manager.restore(step, None)["params"]
  manager.close()
  tok_path = workdir / "tokenizer.json"
  tok = load_tokenizer(tok_path) if tok_path.is_file() else None
  return cfg, params, tok, step
