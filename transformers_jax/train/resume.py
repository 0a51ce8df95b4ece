"""Starting a run where its folder says: from what the start found there (runs.Run.found, read
once), whether it resumes and whether the resume continues the same run; verified restores of
the newest intact checkpoint, and parameters taken from another run (init_from)."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from transformers_jax.errors import CheckpointDamaged, RunError, UserError
from transformers_jax.records import asks_for_population, flatten_dict
from transformers_jax.run_folder import runs
from transformers_jax.run_folder.runs import Found, Run
from transformers_jax.train.state import on_device
from transformers_jax.train_config import training_fields


def check_same_model(found: Found | Run, config) -> None:
  """A resume keeps the model the run was made with (config.json's model fields), except for
  the fields that say how it is computed (runs.IMPLEMENTATION_FIELDS: recorded, not refused).
  `found` is what the start found in the run folder (given a Run, it is read now)."""
  found = found if isinstance(found, Found) else found.found()
  saved = found.saved_config
  if saved is None:
    return
  diffs = config_differences(saved.get("model", {}), config.model.to_dict(), "model.")
  diffs = [d for d in diffs if d.split(" (")[0] not in runs.IMPLEMENTATION_FIELDS]
  if not saved.get("model", {}).get("lora_rank") and not config.model.get("lora_rank"):
    # without LoRA the other lora_* fields change nothing: a run saved with lora_targets and
    # no rank resumes with them at their default, as field_checks.check_lora asks
    diffs = [d for d in diffs if not d.startswith("model.lora_")]
  if diffs:
    raise UserError(
        f"{found.path} holds a run of a different model ({'; '.join(diffs)}): "
        "use a new --workdir or the saved model config"
    )


# data fields that say how batches are computed, not which: the batches are identical by design
HARMLESS_DATA_FIELDS = ("data.workers", "data.prefetch", "data.tokenize_workers")


def check_resumed_settings(found: Found | Run, config, allow_data_change: bool) -> dict:
  """Settings a resume changes (other than the model's, checked before): changing the seed or
  the data needs `allow_data_change`; a single run resumed as a population (or the reverse) and
  another tokenizer are refused. `found` as for check_same_model."""
  found = found if isinstance(found, Found) else found.found()
  if not found.resumes or found.saved_config is None:
    return {}
  changes = resume_changes(found, config)
  data = [f for f in changes if f.startswith(runs.DATA_FIELDS) and f not in HARMLESS_DATA_FIELDS]
  if "data.path" in data and _same_file(*changes["data.path"]):  # another name for the same file
    data.remove("data.path")
  population = {f: v for f, v in changes.items() if f.startswith("population.")}
  saved_members = asks_for_population(found.saved_config.get("population", {}))
  if saved_members != asks_for_population(config.get("population", {})):
    # a single run's state and a population's cannot stand in for each other (other members
    # of a population are Setup.check_same_members' to name)
    said = "; ".join(f"{f} {a!r} saved, {b!r} now" for f, (a, b) in population.items())
    flags = " ".join(f"--config.{f}={a!r}" for f, (a, _) in population.items())
    held = "a population" if saved_members else "a single run (no population)"
    raise UserError(
        f"{found.path} holds {held} and this run's population settings differ ({said}): "
        f"resume with {flags}, or use a new --workdir"
    )
  if "data.tokenizer" in changes:  # the run's own tokenizer.json would be used regardless
    before, now = changes["data.tokenizer"]
    raise UserError(
        f"resuming {found.path} with another tokenizer (data.tokenizer {before!r} before, "
        f"{now!r} now): the model's token ids are its saved tokenizer's, even with "
        "--allow_data_change; use a new --workdir (--config.init_from to start from these "
        "parameters, with a vocabulary of the same size)"
    )
  if data and not allow_data_change:
    said = "; ".join(f"{f} ({changes[f][0]!r} before, {changes[f][1]!r} now)" for f in data)
    raise UserError(
        f"resuming {found.path} with other data: {said}; the steps after the checkpoint would "
        "see another stream of examples than the run's: pass --allow_data_change to resume so "
        "anyway, or use a new --workdir"
    )
  return changes


def resume_changes(found: Found, config) -> dict[str, list]:
  """{dotted field: [value in force, value now]} of the settings that `config` (a ConfigDict)
  changes: every field but the model's, whose implementation fields alone may change."""
  in_force = flatten_dict(found.in_force or {})
  now = flatten_dict(json.loads(config.to_json_best_effort()))
  defaults = flatten_dict(json.loads(training_fields().to_json_best_effort()))
  out = {}
  for field in sorted(set(in_force) | set(now)):
    if field in runs.UNRECORDED_FIELDS or (
        field.startswith("model.") and field not in runs.IMPLEMENTATION_FIELDS
    ):
      continue
    if field not in in_force and field in defaults and now.get(field) == defaults[field]:
      continue  # a field newer than the run's config.json, left at its default: no change
    if in_force.get(field) != now.get(field):
      out[field] = [in_force.get(field), now.get(field)]
  return out


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


def _same_file(before: str, now: str) -> bool:
  """Whether two data.path values name the same existing file or folder (a relative and an
  absolute path, a link): its content is then checked by data_source_changes."""
  try:
    return bool(before) and os.path.samefile(before, now)
  except OSError:
    return False


def prepare_folder(run: Run, config, allow_data_change: bool) -> tuple[Found, dict | None]:
  """Checks before a run (re)starts in its folder, on what the start found there (Run.found,
  returned): checkpoints left, the same model, and data changes allowed. With it, the settings
  a resume changes ({} for none), or None for a new run (or one starting from a
  parameters-only checkpoint), which config.json describes from here on."""
  run.path.mkdir(parents=True, exist_ok=True)
  found = run.found()
  if found.none_left is not None:  # not a new run: its every checkpoint was found damaged
    raise UserError(str(found.none_left))
  check_same_model(found, config)
  if not found.resumes:
    return found, None
  return found, check_resumed_settings(found, config, allow_data_change)


def write_folder(run: Run, config, changes: dict | None, data_source: str | None = None) -> None:
  """config.json of a new run, and run.json of this invocation with what identifies its data
  (process 0 writes them)."""
  if jax.process_index() == 0:
    if changes is None:
      run.write_config(config)
    runs.write_run_info(run.path, sys.argv, data_source=data_source)


def note_changes(run: Run, start: int, changes: dict | None) -> None:
  """Say, and record in run_history.jsonl, the settings a resume at `start` changed."""
  if changes and jax.process_index() == 0:
    said = ", ".join(f"{f}: {a!r} -> {b!r}" for f, (a, b) in changes.items())
    print(f"resumed with changed settings ({said}): recorded in run_history.jsonl", flush=True)
    run.record_changes(start, changes, sys.argv)


def data_source_changes(found: Found, source: str | None, allow_data_change: bool) -> dict:
  """{"data.source": [before, now]} when the content of the run's data files changed since the
  last invocation recorded it in run.json (a file grown, shrunk or rewritten gives another
  token cache); a UserError unless `allow_data_change`."""
  before = found.data_source
  if source is None or before is None or before == source:
    return {}
  if not allow_data_change:
    raise UserError(
        f"resuming {found.path} with other data: the files at data.path changed since the run "
        f"last read them (size, modification time or content: {before} before, {source} now); "
        "the steps after the checkpoint would see other examples than the run's: pass "
        "--allow_data_change to resume so anyway, or use a new --workdir"
    )
  return {"data.source": [before, source]}


def non_finite(tree) -> str | None:
  """None when every floating-point value of a restored (device) state is finite, else which
  is not."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  floats = [(k, v) for k, v in flat if jnp.issubdtype(getattr(v, "dtype", np.int32), jnp.inexact)]
  if not floats:
    return None

  values = [v for _, v in floats]
  held = [v.sharding for v in values]  # config.host_offload: read in device memory, not on host
  finite = jax.device_get(
      jax.jit(lambda xs: [jnp.all(jnp.isfinite(x)) for x in on_device(xs, held)])(values)
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
  except CheckpointDamaged as e:
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


def init_from_run(path: str) -> pathlib.Path:
  """The run folder `init_from` names: a run's folder, its checkpoints/ or one step in it."""
  source = pathlib.Path(path)
  if source.name.isdigit() and source.parent.name == "checkpoints":
    source = source.parent
  return source.parent if source.name == "checkpoints" else source


def load_init_from(path: str, member: int = -1):
  """(parameters as host arrays, step) of the latest intact checkpoint of run `path` (or of its
  checkpoints/ folder), or of the one step folder `path` names (RUN/checkpoints/<step>); of
  population member `member` when `path` holds a population."""
  source = pathlib.Path(path)
  step = int(source.name) if source.name.isdigit() and source.parent.name == "checkpoints" else None
  run = Run(init_from_run(path))
  if run.latest_step() is None:
    raise UserError(
        f"init_from={path}: no checkpoint found there: give a run's folder, its checkpoints/ "
        "folder or one step's folder in it"
    )
  try:
    return run.load_params(
        step=step, member=None if member < 0 else member, member_flag="--config.init_member"
    )
  except RunError as e:
    raise UserError(f"init_from={path}: {e}") from None
