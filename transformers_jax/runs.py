"""A run folder, the one place training, decoding and conversion meet:

  WORKDIR/config.json      the experiment config the run was made with
  WORKDIR/tokenizer.json   its tokenizer (text tasks)
  WORKDIR/checkpoints/<step>/
                           an orbax checkpoint: a full train state (params, opt_state, step,
                           rng) written by training, or parameters only (written by convert)

  WORKDIR/checkpoints/checksums.json
                           SHA-256 of every file of each committed checkpoint, recorded once the
                           save has finished and verified before a restore
  WORKDIR/run.json         how this invocation ran: code version, packages, devices, command line
  WORKDIR/run_history.jsonl
                           one line per resume that changed settings (config.json keeps the
                           settings the run started with)
  WORKDIR/.lock            host and pid of the run using the folder

A step directory appears only once it is complete (orbax writes under a temporary name and
renames on commit), so a crash mid-save never looks like a good checkpoint; one that was damaged
afterwards (a flipped bit, a truncated file) fails its checksums or holds non-finite values, is
renamed to <step>.damaged and the newest intact one is used instead, by a training resume and
by Run.load_params (generate, convert, init_from) alike.
"""

from __future__ import annotations

import hashlib
import json
import os
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
    """Start saving (asynchronously once the arrays are copied off the devices). The previous
    save has finished by then (orbax waits for it) and its checksums are recorded first."""
    self.manager.wait_until_finished()
    self._record_checksums()
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, step: int, target):
    """Restore into `target` (ShapeDtypeStructs with shardings: any mesh works), or as numpy
    arrays when `target` is None. An array whose shape differs from the stored one is a
    ValueError before anything is read."""
    if target is not None:
      self._check_shapes(step, target)
    return self.manager.restore(step, args=ocp.args.StandardRestore(target))

  def _check_shapes(self, step: int, target) -> None:
    """Compare `target`'s array shapes with the checkpoint's metadata. (A restore that orbax
    abandons part way leaves tensorstore reads whose callbacks find orbax's event loop closed,
    and each prints a traceback: hundreds of lines after the one that says what is wrong.)"""
    import jax

    def by_name(tree):
      leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
      return {
          tuple(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path): (
              leaf
          )
          for path, leaf in leaves
      }

    try:
      stored = self.manager.item_metadata(step)
    except (ValueError, KeyError, OSError, TypeError):
      return  # orbax's own restore reports what it cannot read
    stored = by_name(getattr(stored, "tree", stored))
    for name, leaf in by_name(target).items():
      want, have = getattr(leaf, "shape", None), getattr(stored.get(name), "shape", None)
      if want is not None and have is not None and tuple(want) != tuple(have):
        raise ValueError(
            f"Requested shape: {tuple(want)} is not compatible with the stored shape: "
            f"{tuple(have)} (at {'.'.join(name)})"
        )

  def wait(self) -> None:
    self.manager.wait_until_finished()
    self._record_checksums()

  def close(self) -> None:
    self.wait()
    self.manager.close()

  # ------------------------------------------------------------------ integrity
  @property
  def checksum_path(self) -> pathlib.Path:
    return self.directory / "checksums.json"

  def _checksums(self) -> dict:
    try:
      return json.loads(self.checksum_path.read_text())
    except (OSError, ValueError):
      return {}

  def _record_checksums(self) -> None:
    """Checksums of committed checkpoints that have none yet (written by process 0 alone; the
    checkpoint folder is shared by every process)."""
    import jax

    if jax.process_index() != 0:
      return
    recorded = self._checksums()
    steps = {str(s) for s in self.manager.all_steps()}
    missing = [s for s in steps if s not in recorded]
    stale = [s for s in recorded if s not in steps]
    if not missing and not stale:
      return
    for s in stale:  # removed by max_to_keep
      del recorded[s]
    for s in missing:
      recorded[s] = file_checksums(self.directory / s)
    tmp = self.checksum_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(recorded, indent=1, sort_keys=True))
    os.replace(tmp, self.checksum_path)

  def damage(self, step: int) -> str | None:
    """What is wrong with the files of checkpoint `step` against the checksums recorded when it
    was committed, or None (intact, or saved before checksums were recorded)."""
    want = self._checksums().get(str(step))
    if want is None:
      return None
    have = file_checksums(self.directory / str(step))
    for name in sorted(set(want) | set(have)):
      if name not in have:
        return f"file {name} is missing"
      if want.get(name) != have[name]:
        return f"file {name} differs from its checksum" if name in want else f"extra file {name}"
    return None

  def set_aside(self, step: int) -> pathlib.Path:
    """Rename a damaged checkpoint to <step>.damaged (kept for inspection, no longer a step)."""
    import jax

    source = self.directory / str(step)
    target = source.with_name(f"{step}.damaged")
    n = 1
    while target.exists():
      n += 1
      target = source.with_name(f"{step}.damaged{n}")
    if jax.process_index() == 0:
      source.rename(target)
    _sync_processes(f"set_aside_{step}")
    self.manager.reload()
    return target

  def restore_intact(self, target, check=None, on_damaged=print):
    """(restored tree, step) of the newest checkpoint that is intact: its files match their
    checksums, it restores, and `check(tree)` (e.g. all values finite) returns None rather than
    a problem. Damaged ones are set aside with a one-line note to `on_damaged`; (None, None)
    when there is no checkpoint; CheckpointDamaged when none is intact."""
    damaged = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      problem = self.damage(step)
      tree = None
      if problem is None:
        try:
          tree = self.restore(step, target(step) if callable(target) else target)
        except (ValueError, KeyError):  # the tree does not fit: the caller's error to report
          raise
        except Exception as e:  # a truncated or unreadable file  # noqa: BLE001
          text = str(e).strip().splitlines()
          problem = f"it does not restore ({type(e).__name__}: {text[0] if text else ''})"
      if problem is None and check is not None:
        problem = check(tree)
      if problem is None:
        return tree, step
      aside = self.set_aside(step)
      damaged.append(step)
      on_damaged(
          f"note: checkpoint step {step} in {self.directory} is damaged ({problem}): moved to "
          f"{aside.name}; trying the next older one"
      )
    if damaged:
      raise CheckpointDamaged(
          f"no intact checkpoint in {self.directory}: step(s) "
          f"{', '.join(map(str, damaged))} are damaged (moved to <step>.damaged): use a new "
          "--workdir, or copy an intact checkpoint there"
      )
    return None, None


def file_checksums(folder: pathlib.Path) -> dict[str, str]:
  """{path relative to `folder`: SHA-256} of every file under it."""
  out = {}
  for path in sorted(folder.rglob("*")):
    if path.is_file():
      with open(path, "rb") as f:
        out[path.relative_to(folder).as_posix()] = hashlib.file_digest(f, "sha256").hexdigest()
  return out


def non_finite_values(tree) -> str | None:
  """None when every floating-point array of a host (numpy) tree is finite, else which is not."""
  import numpy as np

  bad = []

  def visit(prefix, node):
    if isinstance(node, dict):
      for key, value in node.items():
        visit(f"{prefix}/{key}" if prefix else str(key), value)
    elif isinstance(node, (list, tuple)):
      for i, value in enumerate(node):
        visit(f"{prefix}/{i}", value)
    else:
      array = np.asarray(node)
      if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
        bad.append(prefix)

  visit("", tree)
  if not bad:
    return None
  return f"non-finite values in {bad[0]}" + (f" and {len(bad) - 1} more" if bad[1:] else "")


def _sync_processes(name: str) -> None:
  import jax

  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


class RunError(ValueError):
  """A run folder that cannot give what was asked (one line: the problem and the fix)."""


class CheckpointDamaged(RunError):
  """Every checkpoint of a run is damaged."""


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

  # ------------------------------------------------------------------ settings history
  @property
  def history_path(self) -> pathlib.Path:
    return self.path / "run_history.jsonl"

  def history(self) -> list[dict]:
    """run_history.jsonl: one entry per resume that changed settings."""
    if not self.history_path.is_file():
      return []
    return [json.loads(x) for x in self.history_path.read_text().splitlines() if x.strip()]

  def record_changes(self, step: int, changes: dict, argv=()) -> None:
    import datetime

    entry = {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "resumed_at_step": step,
        "changes": changes,
        "argv": list(argv),
    }
    with open(self.history_path, "a") as f:
      f.write(json.dumps(entry) + "\n")

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

  def starts_from_parameters(self) -> bool:
    """Whether the latest checkpoint holds parameters only (a converted model): training here
    starts from them with a fresh optimizer and its own data, continuing no earlier stream."""
    step = self.latest_step()
    if step is None:
      return False
    checkpoints = self.checkpoints(async_save=False)
    try:
      return checkpoints.kind(step) == PARAMS_ONLY
    finally:
      checkpoints.manager.close()  # read only: nothing to record

  def load_params(self, step: int | None = None, on_damaged=print):
    """(parameters as numpy arrays, step) of the latest (or the given) checkpoint, from a full
    train state or a parameters-only checkpoint alike. Checkpoints are verified as training's
    resume verifies them (recorded checksums, finite values): without a step, a damaged one is
    set aside with a one-line note to `on_damaged` and the next older one used; a damaged
    given step, or no intact checkpoint at all, raises RunError."""
    if not self.config_path.is_file():
      raise RunError(f"{self.path} has no config.json: pass the --workdir of a run")
    steps = self.steps()
    if not steps:
      raise RunError(
          f"{self.path} has no checkpoint yet: train it first (python -m "
          "transformers_jax.train --workdir ...) or convert a model into it"
      )
    if step is not None and step not in steps:
      raise RunError(
          f"--step={step}: {self.path} has checkpoints at steps " f"{', '.join(map(str, steps))}"
      )
    manager = self.checkpoints(async_save=False)
    try:
      if step is None:
        tree, step = manager.restore_intact(None, check=non_finite_values, on_damaged=on_damaged)
      else:
        problem = manager.damage(step)
        tree = manager.restore(step, None) if problem is None else None
        problem = problem or non_finite_values(tree)
        if problem is not None:
          raise CheckpointDamaged(
              f"--step={step}: checkpoint step {step} in {manager.directory} is damaged "
              f"({problem}): leave out --step to use the newest intact checkpoint"
          )
    finally:
      manager.close()
    return tree["params"], step

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


# ---------------------------------------------------------------------------- one run per folder
class WorkdirBusy(RunError):
  """Another live run holds the folder's lock."""


class WorkdirLock:
  """WORKDIR/.lock: {host, pid, started} of the run using the folder, created exclusively. A
  lock whose process is gone (same host, no such pid) is taken over; one held by a live process,
  or by another host (whose processes cannot be checked from here), stops the second run."""

  def __init__(self, workdir):
    self.path = pathlib.Path(workdir) / ".lock"
    self.held = False

  def acquire(self) -> str | None:
    """Take the lock; returns a note when a dead run's lock was taken over, else None."""
    import datetime
    import socket

    host = socket.gethostname()
    note = None
    self.path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = self._holder()
        if holder is None:  # being written this instant, or not ours to read: look again
          import time

          time.sleep(0.2)
          holder = self._holder() or {}
        if holder.get("host") == host and not _pid_alive(holder.get("pid")):
          self.path.unlink(missing_ok=True)
          note = (
              f"note: took over the lock of a run that is gone (host {host}, pid "
              f"{holder.get('pid')})"
          )
          continue
        raise WorkdirBusy(
            f"{self.path.parent} is in use by another run (host {holder.get('host', '?')}, pid "
            f"{holder.get('pid', '?')}, since {holder.get('started', '?')}): wait for it or "
            f"stop it, or use another --workdir; if that run is gone, delete {self.path}"
        ) from None
      started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
      with os.fdopen(fd, "w") as f:
        json.dump({"host": host, "pid": os.getpid(), "started": started}, f)
      self.held = True
      return note
    raise WorkdirBusy(f"could not take {self.path}: another run keeps taking it")

  def _holder(self) -> dict | None:
    try:
      holder = json.loads(self.path.read_text())
      return holder if isinstance(holder, dict) and "pid" in holder else None
    except (OSError, ValueError):
      return None

  def release(self) -> None:
    if self.held:
      holder = self._holder() or {}
      if holder.get("pid") == os.getpid():
        self.path.unlink(missing_ok=True)
      self.held = False


def _pid_alive(pid) -> bool:
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's live process
    return True
  return True


# ---------------------------------------------------------------------------- run record
def write_run_info(workdir, argv) -> dict:
  """WORKDIR/run.json for this invocation: code version, package versions, devices, processes
  and the command line."""
  import importlib.metadata
  import subprocess
  import sys

  import jax

  source = pathlib.Path(__file__).resolve().parent.parent
  code = {"source": str(source)}
  try:
    git = lambda *a: subprocess.run(  # noqa: E731
        ["git", *a], cwd=source, capture_output=True, text=True, timeout=10
    )
    head = git("rev-parse", "HEAD")
    if head.returncode == 0:
      code["git_commit"] = head.stdout.strip()
      code["git_dirty"] = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
  except (OSError, subprocess.SubprocessError):
    pass
  packages = {}
  for name in (
      "transformers_jax",
      "jax",
      "jaxlib",
      "libtpu",
      "flax",
      "optax",
      "orbax-checkpoint",
      "numpy",
      "ml_collections",
      "tokenizers",
  ):
    try:
      packages[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  devices = jax.devices()
  info = {
      "code": code,
      "python": sys.version.split()[0],
      "packages": packages,
      "device_kind": devices[0].device_kind,
      "platform": devices[0].platform,
      "device_count": len(devices),
      "local_device_count": jax.local_device_count(),
      "process_count": jax.process_count(),
      "argv": list(argv),
  }
  path = pathlib.Path(workdir) / "run.json"
  path.write_text(json.dumps(info, indent=1) + "\n")
  return info


# ---------------------------------------------------------------------------- resumed settings
# Fields whose change on resume alters which examples the rest of the run sees.
DATA_FIELDS = ("seed", "data.")
# Fields that say where things are, not what the run is.
UNRECORDED_FIELDS = ("data.cache_dir",)


def _unflatten_into(tree: dict, dotted: str, value) -> None:
  *parents, name = dotted.split(".")
  for key in parents:
    tree = tree.setdefault(key, {})
  tree[name] = value


def settings_in_force(run: "Run") -> dict | None:
  """config.json with the changes recorded in run_history.jsonl applied in order: what the
  latest part of the run ran with (None for a new run)."""
  settings = run.saved_config()
  if settings is None:
    return None
  for entry in run.history():
    for field, (_, new) in entry.get("changes", {}).items():
      _unflatten_into(settings, field, new)
  return settings


def resume_changes(run: "Run", config) -> dict[str, list]:
  """{dotted field: [value in force, value now]} of the settings other than the model's that
  `config` (a ConfigDict) changes."""
  from transformers_jax.config import flatten_dict

  in_force = flatten_dict(settings_in_force(run) or {})
  now = flatten_dict(json.loads(config.to_json_best_effort()))
  out = {}
  for field in sorted(set(in_force) | set(now)):
    if field.startswith("model.") or field in UNRECORDED_FIELDS:
      continue
    if in_force.get(field) != now.get(field):
      out[field] = [in_force.get(field), now.get(field)]
  return out


def data_changes(changes: dict) -> list[str]:
  """The fields among `changes` that alter which examples the run sees."""
  return [f for f in changes if f == "seed" or f.startswith("data.")]
