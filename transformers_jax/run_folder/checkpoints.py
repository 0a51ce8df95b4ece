"""Orbax checkpoints of one folder, and their integrity:

DIR/<step>/        a committed checkpoint (orbax writes under a temporary name and renames on
                   commit, so a crash mid-save never looks like a good checkpoint)
DIR/checksums.json SHA-256 of every file of each committed checkpoint, recorded once its save
                   has finished and verified before a restore (written as {} when the folder
                   is made, so that a missing one means it was lost)
DIR/<step>.damaged a checkpoint that failed its checksums, lacks a file orbax needs, did not
                   restore or held non-finite values: set aside for inspection; the newest
                   intact one is used instead

A checksums.json that is missing or unreadable while checkpoints exist leaves them unverifiable:
a flipped bit would load unnoticed, so loading refuses (one line) until the file is put back,
or replaced by an empty record {} by a user who trusts the checkpoints as they are (their
checksums are then recorded anew). Files a user added to a checkpoint folder are not damage.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp

from transformers_jax.run_folder import disk_full
from transformers_jax.errors import CheckpointDamaged

FULL_STATE, PARAMS_ONLY = "train_state", "params"
REQUIRED_FILES = ("_CHECKPOINT_METADATA", "default/_METADATA", "default/manifest.ocdbt")


def missing_file(folder: pathlib.Path) -> str | None:
  """The first file of REQUIRED_FILES that committed checkpoint `folder` lacks, or None: OCDBT's
  manifest only where its _METADATA does not say it was written without OCDBT (save_params)."""
  try:  # unreadable: restoring it says what is wrong
    ocdbt = json.loads((folder / REQUIRED_FILES[1]).read_text()).get("use_ocdbt", True)
  except (OSError, ValueError, AttributeError):
    ocdbt = True
  names = REQUIRED_FILES if ocdbt else REQUIRED_FILES[:2]
  return next((name for name in names if not (folder / name).is_file()), None)


# How tensorstore's errors (raised as ValueError) begin when a checkpoint's files are damaged,
# as opposed to a tree that does not fit the target.
STORAGE_ERRORS = ("NOT_FOUND", "DATA_LOSS", "OUT_OF_RANGE", "UNKNOWN", "INTERNAL", "FAILED_PREC")


class Checkpoints:
  """Orbax checkpoints in one folder: save a tree at a step, restore it onto any mesh."""

  def __init__(self, directory, keep: int = 2, async_save: bool = True, ocdbt: bool = True):
    # ocdbt=False: each array in files of its own; OCDBT's one database buffers about the whole
    # tree in host memory while it writes (2.2 GiB of bf16: +1.7 GiB, against +0.2 GiB)
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=True,
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=True,
    )
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=options,
        item_handlers=ocp.StandardCheckpointHandler(use_ocdbt=ocdbt),
    )
    disk_full.quiet_disk_full_logs()
    self._saving = (None, 0)  # (step, bytes) of the latest save started
    if jax.process_index() == 0 and not self.checksum_path.exists() and not self.steps():
      self.checksum_path.write_text("{}")  # a new folder: from here a missing record is a loss

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def kind(self, step: int) -> str:
    """FULL_STATE or PARAMS_ONLY: what the checkpoint at `step` holds (FULL_STATE when its
    metadata cannot be read: restoring it finds the damage and falls back)."""
    if missing_file(self.directory / str(step)):
      return FULL_STATE
    try:
      tree = self.manager.item_metadata(step)
    except Exception:  # a damaged checkpoint; restore_intact says what is wrong  # noqa: BLE001
      return FULL_STATE
    tree = getattr(tree, "tree", tree)
    return PARAMS_ONLY if tree is not None and "opt_state" not in tree else FULL_STATE

  def stored_tree(self, step: int):
    """The tree of checkpoint `step` with each array's metadata (shape, dtype) in its place, or
    None when its metadata cannot be read (restoring it finds the damage)."""
    try:
      tree = self.manager.item_metadata(step)
    except Exception:  # a damaged checkpoint; restore_intact says what is wrong  # noqa: BLE001
      return None
    return getattr(tree, "tree", tree)

  def save(self, step: int, state) -> None:
    """Start saving (asynchronously once the arrays are copied off the devices). The previous
    save has finished by then (orbax waits for it) and its checksums are recorded first."""
    self.wait()
    self._saving = (step, sum(getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(state)))
    self._unless_full(
        lambda: self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
    )

  def _unless_full(self, call):
    """call(), with a save that ran out of disk space as one UserError (disk_full.py)."""
    try:
      return call()
    except Exception as e:  # orbax re-raises its threads' errors as they came  # noqa: BLE001
      if not disk_full.is_disk_full(e):
        raise
      step, needed = self._saving
      saved = [int(p.name) for p in self.directory.iterdir() if p.name.isdigit()]
      newest = max((s for s in saved if s != step), default=None)
      raise disk_full.save_failed(self.directory, step, needed, newest) from None

  def restore(self, step: int, target):
    """Restore onto the devices this process has, whatever mesh, device count or process count
    wrote the checkpoint: into `target` (ShapeDtypeStructs with this process's shardings), or,
    when `target` is None, every array as a whole numpy array on the host (what generate,
    convert and init_from read). An array whose shape differs from the stored one is a
    ValueError before anything is read. (Left without a target, orbax would rebuild the
    writer's shardings and refuse any other topology.)"""
    if target is None:
      target = self.host_target(step)
    else:
      self._check_shapes(step, target)
    return self.manager.restore(step, args=ocp.args.StandardRestore(target))

  def host_target(self, step: int):
    """The checkpoint's tree with a numpy placeholder of each array's shape and dtype (no
    memory: one broadcast zero): a restore target that reads every array whole onto the host."""
    stored = self.manager.item_metadata(step)
    return jax.tree_util.tree_map(
        lambda leaf: np.broadcast_to(np.zeros((), leaf.dtype), leaf.shape),
        getattr(stored, "tree", stored),
    )

  def _check_shapes(self, step: int, target) -> None:
    """Compare `target`'s array shapes with the checkpoint's metadata. (A restore that orbax
    abandons part way leaves tensorstore reads whose callbacks find orbax's event loop closed,
    and each prints a traceback: hundreds of lines after the one that says what is wrong.)"""

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
    self._unless_full(self.manager.wait_until_finished)
    self._unless_full(self._record_checksums)

  def close(self) -> None:
    self.wait()
    self.manager.close()

  # ------------------------------------------------------------------ integrity
  @property
  def checksum_path(self) -> pathlib.Path:
    return self.directory / "checksums.json"

  def _checksums(self) -> dict:
    record = self._checksum_record()
    return record if isinstance(record, dict) else {}

  def _checksum_record(self) -> dict | str:
    """The recorded checksums, or what makes them unusable (missing while checkpoints exist,
    not JSON, not a record of steps)."""
    try:
      record = json.loads(self.checksum_path.read_text())
    except FileNotFoundError:
      return "is missing" if self.steps() else {}
    except (OSError, ValueError) as e:
      return f"is unreadable ({type(e).__name__})"
    if not isinstance(record, dict) or not all(isinstance(v, dict) for v in record.values()):
      return "is not a record of checkpoint checksums"
    return record

  def unverifiable(self) -> str | None:
    """Why the checkpoints cannot be verified (their checksum record is lost), or None."""
    record = self._checksum_record()
    if isinstance(record, dict):
      return None
    return (
        f"{self.checksum_path} {record}, so checkpoint step(s) "
        f"{', '.join(map(str, self.steps()))} cannot be verified (a damaged file would load "
        "unnoticed): put back the file the run wrote, or, to trust the checkpoints as they are, "
        f"replace it with an empty record: echo '{{}}' > {self.checksum_path}"
    )

  def _record_checksums(self) -> None:
    """Checksums of committed checkpoints that have none yet (written by process 0 alone; the
    checkpoint folder is shared by every process)."""
    if jax.process_index() != 0:
      return
    recorded = self._checksum_record()
    if not isinstance(recorded, dict):  # lost: recording now would vouch for unverified files
      return
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
    folder = self.directory / str(step)
    missing = missing_file(folder)
    if missing:
      return f"file {missing} is missing"
    unverifiable = self.unverifiable()
    if unverifiable:
      raise CheckpointDamaged(unverifiable)
    want = self._checksums().get(str(step))
    if want is None:
      return None
    have = file_checksums(folder)
    for name in sorted(want):  # files a user added are not the checkpoint's
      if name not in have:
        return f"file {name} is missing"
      if want[name] != have[name]:
        return f"file {name} differs from its checksum"
    return None

  def set_aside(self, step: int) -> pathlib.Path:
    """Rename a damaged checkpoint to <step>.damaged (kept for inspection, no longer a step)."""
    source = self.directory / str(step)
    target = source.with_name(f"{step}.damaged")
    n = 1
    while target.exists():
      n += 1
      target = source.with_name(f"{step}.damaged{n}")
    failed = None
    if jax.process_index() == 0:
      try:
        source.rename(target)
      except OSError as e:  # a read-only folder: the others must not wait at the sync for it
        failed = e
    sync_processes(f"set_aside_{step}")
    self.manager.reload()
    if failed is not None:
      raise failed
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
        except (ValueError, KeyError) as e:
          if not str(e).startswith(STORAGE_ERRORS):  # a tree that does not fit: the caller's
            raise
          problem = f"it does not restore ({str(e).split(':')[0]}: a file is missing or damaged)"
        except Exception as e:  # a truncated or unreadable file  # noqa: BLE001
          text = str(e).strip().splitlines()
          problem = f"it does not restore ({type(e).__name__}: {text[0] if text else ''})"
      if problem is None and check is not None:
        problem = check(tree)
      if problem is None:
        return tree, step
      try:
        where = f"moved to {self.set_aside(step).name}"
      except OSError as e:  # a read-only run folder: it stays, and the older one is read
        where = f"left in place, as it cannot be moved aside ({e.strerror or e})"
      damaged.append(step)
      on_damaged(
          f"note: checkpoint step {step} in {self.directory} is damaged ({problem}): {where}; "
          "trying the next older one"
      )
    if damaged:
      raise CheckpointDamaged(
          f"no intact checkpoint in {self.directory}: step(s) "
          f"{', '.join(map(str, damaged))} are damaged (moved to <step>.damaged where the "
          "folder is writable)",
          ": use a new --workdir, or copy an intact checkpoint there",
      )
    none_left = every_one_set_aside(self.directory)
    if none_left is not None:  # starting over here would not be a resume
      raise none_left
    return None, None


def every_one_set_aside(directory) -> CheckpointDamaged | None:
  """The error of a checkpoint folder where an earlier start set aside every checkpoint as
  damaged (<step>.damaged folders and no step left), or None."""
  directory = pathlib.Path(directory).absolute()
  aside = sorted(p.name for p in directory.glob("*.damaged*") if p.is_dir())
  if not aside:
    return None
  return CheckpointDamaged(
      f"no intact checkpoint in {directory}: an earlier start set aside every one as damaged "
      f"({', '.join(aside)})",
      "; use a new --workdir, copy an intact checkpoint there, or delete those folders to start "
      "this run over from step 0",
  )


def file_checksums(folder: pathlib.Path) -> dict[str, str]:
  """{path relative to `folder`: SHA-256} of every file under it."""
  out = {}
  for path in sorted(folder.rglob("*")):
    if path.is_file():
      with open(path, "rb") as f:
        out[path.relative_to(folder).as_posix()] = hashlib.file_digest(f, "sha256").hexdigest()
  return out


def non_finite_values(tree) -> str | None:
  """None when every floating-point array of a host (numpy) tree is finite, else which is not.
  In a population's state (a tree with "alive"), the frozen state of a diverged member may
  legitimately hold infinities: only the members still training are checked."""
  bad = []
  if isinstance(tree, dict) and "alive" in tree:
    alive = np.asarray(tree["alive"], bool)
    tree = {k: v for k, v in tree.items() if k not in ("params", "opt_state")} | {
        k: _members_where(tree[k], alive) for k in ("params", "opt_state") if k in tree
    }

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


def _members_where(tree, alive):
  """`tree` (leaves with a leading member axis) with the diverged members' values zeroed."""
  if isinstance(tree, dict):
    return {k: _members_where(v, alive) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_members_where(v, alive) for v in tree]
  array = np.asarray(tree)
  if not np.issubdtype(array.dtype, np.inexact) or array.ndim == 0 or len(array) != len(alive):
    return array
  return np.where(alive.reshape((-1,) + (1,) * (array.ndim - 1)), array, 0)


def sync_processes(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
