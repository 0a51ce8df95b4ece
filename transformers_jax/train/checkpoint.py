"""Checkpoints with orbax: a step directory appears only once it is complete (orbax writes to a
temporary name and renames on commit), so a crash mid-save never looks like a good checkpoint.

Layout: WORKDIR/checkpoints/<step>/state (params, opt_state, step, rng). The run's config sits
beside them as WORKDIR/config.json.
"""

from __future__ import annotations

import json
import pathlib

import orbax.checkpoint as ocp


class Checkpoints:

  def __init__(self, directory, keep: int = 2, async_save: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=True,
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=True,
    )
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state) -> None:
    """Start saving (asynchronously once the arrays are copied off the devices)."""
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, step: int, target):
    """Restore into `target` (ShapeDtypeStructs with shardings: any mesh works)."""
    return self.manager.restore(step, args=ocp.args.StandardRestore(target))

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def read_saved_config(workdir) -> dict | None:
  path = pathlib.Path(workdir) / "config.json"
  return json.loads(path.read_text()) if path.exists() else None


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
