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
  WORKDIR/.lock            host and pid of the run using the folder (train/entry.py)

What a training start reads of the folder before it writes there (config.json with its
run_history.jsonl, what the newest checkpoint holds, checkpoints set aside as damaged, the data
recorded in run.json) is read at once by Run.found; train/resume.py decides from what it found.

A step directory appears only once it is complete (orbax writes under a temporary name and
renames on commit), so a crash mid-save never looks like a good checkpoint; one that was damaged
afterwards (a flipped bit, a truncated file) fails its checksums or holds non-finite values, is
renamed to <step>.damaged and the newest intact one is used instead, by a training resume and
by Run.load_params (generate, convert, init_from) alike (transformers_jax/run_folder/checkpoints.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib

from transformers_jax.run_folder.checkpoints import (
    PARAMS_ONLY,
    CheckpointDamaged,
    Checkpoints,
    every_one_set_aside,
    non_finite_values,
)
from transformers_jax import records
from transformers_jax.errors import RunError


class Run:
  """A run folder (see the module docstring); nothing is read until asked for."""

  def __init__(self, workdir):
    self.path = pathlib.Path(workdir)
    self.config_path = self.path / "config.json"
    self.tokenizer_path = self.path / "tokenizer.json"
    self.checkpoint_dir = self.path / "checkpoints"
    # the Hugging Face config.json a converted run came from (convert --from_hf copies it)
    self.hf_config_path = self.path / "hf_config.json"
    self.hf_files_dir = self.path / "hf_files"  # its tokenizer settings etc., written back out

  # ------------------------------------------------------------------ config and tokenizer
  def saved_config(self) -> dict | None:
    """config.json as a dict, or None for a new run."""
    return records.read_config(self.config_path)

  def config(self):
    """config.json as an experiment ConfigDict (RunError when there is none)."""
    from transformers_jax.train_config import config_from_json

    if not self.config_path.is_file():
      raise RunError(f"{self.path} has no config.json: pass the --workdir of a run")
    return config_from_json(self.config_path)

  def model_config(self):
    from transformers_jax.config import ModelConfig

    return ModelConfig.from_dict(self.config().model)

  def write_config(self, config) -> None:
    self.path.mkdir(parents=True, exist_ok=True)
    records.write_text_atomically(
        self.config_path, config.to_json_best_effort(indent=1, sort_keys=True)
    )

  def tokenizer(self):
    """The run's tokenizer, or None (image runs, or converted models without one)."""
    from transformers_jax.data import load_tokenizer

    return load_tokenizer(self.tokenizer_path) if self.tokenizer_path.is_file() else None

  def hf_saved_config(self) -> dict:
    """config.json of the Hugging Face model this run was converted from ({} if none)."""
    try:
      saved = json.loads(self.hf_config_path.read_text())
    except (OSError, ValueError):  # none, or not JSON
      return {}
    return saved if isinstance(saved, dict) else {}

  def hf_start_and_end_ids(self) -> tuple[int, int] | None:
    """(decoder_start_token_id, eos_token_id) of the Hugging Face model this run was converted
    from, when its config.json gives both integers; None otherwise."""
    ids = [self.hf_saved_config().get(k) for k in ("decoder_start_token_id", "eos_token_id")]
    return tuple(ids) if all(isinstance(i, int) and i >= 0 for i in ids) else None

  def hf_forced_eos_id(self) -> int | None:
    """forced_eos_token_id of the Hugging Face model this run was converted from (the token
    transformers' generate ends a row with when it reaches max_new_tokens), or None."""
    value = self.hf_saved_config().get("forced_eos_token_id")
    return value if isinstance(value, int) and value >= 0 else None

  def hf_architecture(self, model) -> str | None:
    """The architecture this run was converted from, where `model` (its ModelConfig) can be
    written as it (Phi-3's fused tensors are Llama's blocks: only this tells them apart)."""
    from transformers_jax.interop.hf_export import exportable_as

    names = self.hf_saved_config().get("architectures") or [""]
    return names[0] if exportable_as(model, names[0]) else None

  # ------------------------------------------------------------------ settings history
  @property
  def history_path(self) -> pathlib.Path:
    return self.path / "run_history.jsonl"

  def history(self) -> list[dict]:
    """run_history.jsonl: one entry per resume that changed settings."""
    return records.read_history(self.history_path)

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
  def checkpoints(self, keep: int = 2, async_save: bool = True, ocdbt: bool = True) -> Checkpoints:
    return Checkpoints(self.checkpoint_dir, keep, async_save, ocdbt)

  def steps(self) -> list[int]:
    """Steps with a complete checkpoint, oldest first (no orbax needed to list them)."""
    if not self.checkpoint_dir.is_dir():
      return []
    return sorted(int(p.name) for p in self.checkpoint_dir.iterdir() if p.name.isdigit())

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def load_params(
      self, step: int | None = None, on_damaged=print, member=None, member_flag="--member"
  ):
    """(parameters as numpy arrays, step) of the latest (or the given) checkpoint, from a full
    train state or a parameters-only checkpoint alike (restore_tree says how checkpoints are
    verified). A population's checkpoint holds every member: `member` picks one (without it, a
    RunError names `member_flag`)."""
    tree, step = self.restore_tree(step, on_damaged)
    return self.member_params(tree, member, member_flag), step

  def restore_tree(self, step: int | None = None, on_damaged=print):
    """(the restored tree as numpy arrays, step) of the latest (or the given) checkpoint: a
    train state (a population's: every member's), or parameters only. Checkpoints are verified
    as training's resume verifies them (recorded checksums, finite values): without a step, a
    damaged one is set aside with a one-line note to `on_damaged` and the next older one used;
    a damaged given step, or no intact checkpoint at all, raises RunError."""
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
    return tree, step

  @staticmethod
  def member_count(tree) -> int | None:
    """How many members a restored tree holds (None: one model, not a population)."""
    return len(tree["alive"]) if "alive" in tree else None

  def member_params(self, tree, member, member_flag: str = "--member"):
    """The parameters of a restored checkpoint tree: member `member`'s of a population's."""
    if self.member_count(tree) is None:  # one model (a population: every leaf has a member axis)
      if member is not None:
        raise RunError(
            f"{member_flag}={member}: {self.path} holds one model, not a population: leave "
            f"out {member_flag}"
        )
      return tree["params"]
    count = self.member_count(tree)
    if member is None or not 0 <= member < count:
      said = "" if member is None else f"{member_flag}={member}: "
      raise RunError(
          f"{said}{self.path} holds a population of {count} members: pass {member_flag}=I "
          f"with I in 0..{count - 1} to pick one (metrics.jsonl has each member's eval_loss)"
      )
    return _member_slice(tree["params"], member)

  def save_params(self, params, step: int = 0) -> None:
    """A parameters-only checkpoint (what convert writes): training in this folder starts from
    these parameters with a fresh optimizer; generate and convert read them as they are. Each
    array is written as files of its own (no OCDBT), which holds the save's host memory to
    little more than the parameters themselves (what a converted checkpoint needs)."""
    manager = self.checkpoints(async_save=False, ocdbt=False)
    try:
      manager.save(step, {"params": params})
    finally:
      manager.close()

  # ------------------------------------------------------------------ what a start reads
  def found(self) -> Found:
    """Everything a training start reads of the folder, read at once before the start writes
    there: train/resume.py decides from it alone."""
    step = self.latest_step()
    params_only = False
    if step is not None:
      checkpoints = self.checkpoints(async_save=False)
      try:
        params_only = checkpoints.kind(step) == PARAMS_ONLY
      finally:
        checkpoints.manager.close()  # read only: nothing to record
    try:
      data_source = json.loads((self.path / "run.json").read_text()).get("data_source")
    except (OSError, ValueError, AttributeError):  # none, not JSON, or not an object
      data_source = None
    saved = self.saved_config()
    return Found(
        path=self.path,
        saved_config=saved,
        in_force=settings_in_force(copy.deepcopy(saved), self.history()),
        resumes=step is not None and not params_only,
        none_left=every_one_set_aside(self.checkpoint_dir) if step is None else None,
        data_source=data_source,
    )


def _member_slice(tree, i: int):
  if isinstance(tree, dict):
    return {k: _member_slice(v, i) for k, v in tree.items()}
  return tree[i]


def load_run(workdir, step: int | None = None, member: int | None = None):
  """(ModelConfig, params, tokenizer or None, step) of a run's latest (or given) checkpoint;
  of population member `member` for a population's run. The blocks are in the layout
  (scanned or looped) config.json says, whichever the checkpoint holds (a resume may change
  model.scan_layers)."""
  from transformers_jax.machine.hardware import quiet_cpu_host
  from transformers_jax.modules.block import in_layout

  quiet_cpu_host()  # before JAX starts: no libtpu complaints from a Python session on a CPU host
  run = Run(workdir)
  params, step = run.load_params(step, member=member)
  model_cfg = run.model_config()
  return model_cfg, in_layout(params, model_cfg.scan_layers), run.tokenizer(), step


# ---------------------------------------------------------------------------- run record
def write_run_info(workdir, argv, data_source: str | None = None) -> dict:
  """WORKDIR/run.json for this invocation: code version, package versions, devices, processes
  and the command line."""
  import importlib.metadata
  import subprocess
  import sys

  import jax

  source = pathlib.Path(__file__).resolve().parents[2]
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
  info.update({"data_source": data_source} if data_source else {})  # see train/resume.py
  path = pathlib.Path(workdir) / "run.json"
  records.write_text_atomically(path, json.dumps(info, indent=1) + "\n")
  return info


# -------------------------------------------------- resumed settings; what a start found
# Fields whose change on resume alters which examples the rest of the run sees.
DATA_FIELDS = ("seed", "data.")
# Fields that say where things are, not what the run is (data.source: see train/resume.py).
UNRECORDED_FIELDS = ("data.cache_dir", "data.source")
# Model fields that say how the model is computed, not what it is, so a resume may change
# them (recorded in run_history.jsonl): every parameter keeps its values, dtype included (dtype
# is the compute dtype; param_dtype, the stored one, is not among them). scan_layers stores
# the blocks' parameters in another layout (one stacked `layers` tree instead of layer_0 ...
# layer_{L-1}): a resume moves them (Setup.in_model_layout), and every reader takes either.
IMPLEMENTATION_FIELDS = tuple(
    f"model.{name}"
    for name in (
        "attention_impl",
        "attention_query_blocks",
        "attention_block_q",
        "attention_block_kv",
        "remat",
        "remat_save",
        "context_strategy",
        "scan_layers",
        "dtype",
        "quantization",
        "quantization_head",
        "kv_cache_dtype",
    )
)


def _unflatten_into(tree: dict, dotted: str, value) -> None:
  *parents, name = dotted.split(".")
  for key in parents:
    tree = tree.setdefault(key, {})
  tree[name] = value


def settings_in_force(saved: dict | None, history: list[dict]) -> dict | None:
  """config.json's settings (`saved`, changed in place) with the changes recorded in
  run_history.jsonl (`history`) applied in order: what the latest part of the run ran with
  (None for a new run)."""
  if saved is None:
    return None
  for entry in history:
    for field, (_, new) in entry.get("changes", {}).items():
      _unflatten_into(saved, field, new)
  return saved


@dataclasses.dataclass(frozen=True)
class Found:
  """What a training start reads of its run folder before it writes there (Run.found): from it
  train/resume.py decides whether the start resumes the run, and what the resume changes."""

  path: pathlib.Path
  saved_config: dict | None  # config.json: the settings the run started with (None: a new run)
  in_force: dict | None  # those with run_history.jsonl's changes applied: what it last ran with
  # whether the newest checkpoint holds a train state, which a start here continues; False
  # for none, and for parameters only (a converted model): training starts from those with a
  # fresh optimizer and its own data, continuing no earlier stream
  resumes: bool
  none_left: CheckpointDamaged | None  # no checkpoint, as an earlier start set every one aside
  data_source: str | None  # what run.json says the data files held when the run last read them
