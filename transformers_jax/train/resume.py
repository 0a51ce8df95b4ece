"""Starting a run where its folder says: checks that a resume continues the same run, verified
restores of the newest intact checkpoint, and parameters taken from another run (init_from)."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from transformers_jax import runs
from transformers_jax.errors import UserError
from transformers_jax.runs import Run, config_differences


def check_same_model(run: Run, config) -> None:
  """A resume keeps the model the run was made with (config.json's model fields)."""
  saved = run.saved_config()
  if saved is None:
    return
  diffs = config_differences(saved.get("model", {}), config.model.to_dict(), "model.")
  if diffs:
    raise UserError(
        f"{run.path} holds a run of a different model ({'; '.join(diffs)}): "
        "use a new --workdir or the saved model config"
    )


def check_resumed_settings(run: Run, config, allow_data_change: bool) -> dict:
  """Settings a resume changes (other than the model's, checked before): changing the seed or
  the data needs `allow_data_change`."""
  if run.latest_step() is None or run.saved_config() is None or run.starts_from_parameters():
    return {}
  changes = runs.resume_changes(run, config)
  data = runs.data_changes(changes)
  if data and not allow_data_change:
    said = "; ".join(f"{f} ({changes[f][0]!r} before, {changes[f][1]!r} now)" for f in data)
    raise UserError(
        f"resuming {run.path} with other data: {said}; the steps after the checkpoint would "
        "see another stream of examples than the run's: pass --allow_data_change to resume so "
        "anyway, or use a new --workdir"
    )
  return changes


def non_finite(tree) -> str | None:
  """None when every floating-point value of a restored (device) state is finite, else which
  is not."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  floats = [(k, v) for k, v in flat if jnp.issubdtype(getattr(v, "dtype", np.int32), jnp.inexact)]
  if not floats:
    return None
  finite = jax.device_get(
      jax.jit(lambda xs: [jnp.all(jnp.isfinite(x)) for x in xs])([v for _, v in floats])
  )
  bad = [
      jax.tree_util.keystr(k, simple=True, separator="/")
      for (k, _), ok in zip(floats, finite)
      if not ok
  ]
  return (
      f"non-finite values in {bad[0]}" + (f" and {len(bad) - 1} more" if bad[1:] else "")
      if bad
      else None
  )


def restore_verified(checkpoints, target, check, does_not_fit: str):
  """(state, step) of the newest intact checkpoint (Checkpoints.restore_intact: damaged ones
  set aside with a note from process 0). No intact one, or a tree that does not fit `target`,
  is a UserError; `does_not_fit` says why and what to do, with {error} for the first line of
  what orbax reported."""
  is_main = jax.process_index() == 0
  try:
    return checkpoints.restore_intact(
        target, check=check, on_damaged=lambda line: is_main and print(line, flush=True)
    )
  except runs.CheckpointDamaged as e:
    raise UserError(str(e)) from None
  except (ValueError, KeyError) as e:
    first = str(e).strip().splitlines()[0]
    raise UserError(
        f"checkpoint step {checkpoints.latest_step()} in {checkpoints.directory} "
        + does_not_fit.format(error=first)
    ) from None


def copy_matching(params, source):
  """Parameters whose path and shape match taken from `source` (a nested dict of arrays), the
  rest kept: (params, names loaded, names left fresh)."""
  flat_src = {
      jax.tree_util.keystr(k, simple=True, separator="/"): v
      for k, v in jax.tree_util.tree_flatten_with_path(source)[0]
  }
  loaded, fresh = [], []

  def take(keypath, leaf):
    name = jax.tree_util.keystr(keypath, simple=True, separator="/")
    src = flat_src.get(name)
    if src is not None and tuple(src.shape) == tuple(leaf.shape):
      loaded.append(name)
      return jax.device_put(np.asarray(src, dtype=leaf.dtype), leaf.sharding)
    fresh.append(name)
    return leaf

  return jax.tree_util.tree_map_with_path(take, params), loaded, fresh


def init_from_run(path: str, params):
  """Copy parameters whose path and shape match from another run's latest checkpoint:
  (params, names loaded, names left fresh, the source's step)."""
  source = pathlib.Path(path)
  run = Run(source.parent if source.name == "checkpoints" else source)
  if run.latest_step() is None:
    raise UserError(f"init_from={path}: no checkpoint found there")
  restored, step = run.load_params()
  params, loaded, fresh = copy_matching(params, restored)
  return params, loaded, fresh, step
