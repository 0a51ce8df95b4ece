"""A run folder, the one place training, decoding and conversion meet:

  WORKDIR/config.json      the experiment config the run was made with
  WORKDIR/tokenizer.json   its tokenizer (text tasks)
  WORKDIR/checkpoints/<step>/
                           an orbax checkpoint: a full train state (params, opt_state, step,
                           rng) written by training, or parameters only (written by convert)

A step directory appears only once it is complete (orbax writes under a temporary name and
renames on commit), so a crash mid-save never looks like a good checkpoint.
"""

from __future__ import annotations

import json
import pathlib

import orbax.checkpoint as ocp

FULL_STATE, PARAMS_ONLY = "train_state", "params"


class Checkpoints:
  """Orbax checkpoints in one folder: save a tree at a step, restore it onto any mesh."""

  def __init__(self, directory, keep: int = 2, async_save: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=True,
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=True,
    )
    self.manager = ocp.CheckpointManager(
        self.directory, options=options, item_handlers=ocp.StandardCheckpointHandler()
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def kind(self, step: int) -> str:
    """FULL_STATE or PARAMS_ONLY: what the checkpoint at `step` holds."""
    tree = self.manager.item_metadata(step)
    tree = getattr(tree, "tree", tree)
    return FULL_STATE if "opt_state" in tree else PARAMS_ONLY

  def save(self, step: int, state) -> None:
    """Start saving (asynchronously once the arrays are copied off the devices)."""
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, step: int, target):
    """Restore into `target` (ShapeDtypeStructs with shardings: any mesh works), or as numpy
    arrays when `target` is None."""
    return self.manager.restore(step, args=ocp.args.StandardRestore(target))

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


class RunError(ValueError):
  """A run folder that cannot give what was asked (one line: the problem and the fix)."""


class Run:
  """A run folder (see the module docstring); nothing is read until asked for."""

  def __init__(self, workdir):
    self.path = pathlib.Path(workdir)
    self.config_path = self.path / "config.json"
    self.tokenizer_path = self.path / "tokenizer.json"
    self.checkpoint_dir = self.path / "checkpoints"

  # ------------------------------------------------------------------ config and tokenizer
  def saved_config(self) -> dict | None:
    """config.json as a dict, or None for a new run."""
    return json.loads(self.config_path.read_text()) if self.config_path.is_file() else None

  def config(self):
    """config.json as an experiment ConfigDict (RunError when there is none)."""
    from transformers_jax.config import config_from_json

    if not self.config_path.is_file():
      raise RunError(f"{self.path} has no config.json: pass the --workdir of a run")
    return config_from_json(self.config_path)

  def model_config(self):
    from transformers_jax.config import ModelConfig

    return ModelConfig.from_dict(self.config().model)

  def write_config(self, config) -> None:
    self.path.mkdir(parents=True, exist_ok=True)
    self.config_path.write_text(config.to_json_best_effort(indent=1, sort_keys=True))

  def tokenizer(self):
    """The run's tokenizer, or None (image runs, or converted models without one)."""
    from transformers_jax.data import load_tokenizer

    return load_tokenizer(self.tokenizer_path) if self.tokenizer_path.is_file() else None

  # ------------------------------------------------------------------ checkpoints
  def checkpoints(self, keep: int = 2, async_save: bool = True) -> Checkpoints:
    return Checkpoints(self.checkpoint_dir, keep, async_save)

  def steps(self) -> list[int]:
    """Steps with a complete checkpoint, oldest first (no orbax needed to list them)."""
    if not self.checkpoint_dir.is_dir():
      return []
    return sorted(int(p.name) for p in self.checkpoint_dir.iterdir() if p.name.isdigit())

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def load_params(self, step: int | None = None):
    """(parameters as numpy arrays, step) of the latest (or the given) checkpoint, from a full
    train state or a parameters-only checkpoint alike."""
    if not self.config_path.is_file():
      raise RunError(f"{self.path} has no config.json: pass the --workdir of a run")
    steps = self.steps()
    if not steps:
      raise RunError(
          f"{self.path} has no checkpoint yet: train it first (python -m "
          "transformers_jax.train --workdir ...) or convert a model into it"
      )
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise RunError(
          f"--step={step}: {self.path} has checkpoints at steps " f"{', '.join(map(str, steps))}"
      )
    manager = self.checkpoints(async_save=False)
    try:
      params = manager.restore(step, None)["params"]
    finally:
      manager.close()
    return params, step

  def save_params(self, params, step: int = 0) -> None:
    """A parameters-only checkpoint (what convert writes): training in this folder starts from
    these parameters with a fresh optimizer; generate and convert read them as they are."""
    manager = self.checkpoints(async_save=False)
    try:
      manager.save(step, {"params": params})
    finally:
      manager.close()


def load_run(workdir, step: int | None = None):
  """(ModelConfig, params, tokenizer or None, step) of a run's latest (or given) checkpoint."""
  run = Run(workdir)
  params, step = run.load_params(step)
  return run.model_config(), params, run.tokenizer(), step


def config_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
  """Dotted names of fields whose values differ between two (nested) config dicts."""
  out = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key), current.get(key)
    name = f"{prefix}{key}"
    if isinstance(a, dict) and isinstance(b, dict):
      out += config_differences(a, b, name + ".")
    elif a != b:
      out.append(f"{name} ({a!r} saved, {b!r} now)")
  return out
