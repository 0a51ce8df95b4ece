"""What a run builds from its config before the first step, once, for every driver: the solo
loop, the population, --compile_only and the benchmark scripts all start from a Setup.

    setup = Setup(config)              # model config, task, mesh, rules, optimizer, shardings
    state = setup.init_state()         # or setup.start(run, checkpoints): resume / init_from
    step = setup.train_step()          # jit(step)(state, batch) -> (state, metrics)

A config with population settings (train/members.py) gets the same object with `members` set:
its state is the members' stacked states, its step the same update body vmapped.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import jax
import optax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from transformers_jax.machine import parallel
from transformers_jax.evaluate.runs import TrainingHarness
from transformers_jax.train import field_checks, trackers
from transformers_jax.config import ModelConfig
from transformers_jax.errors import RunError, UserError
from transformers_jax.models import lora
from transformers_jax.modules import block
from transformers_jax.run_folder.checkpoints import PARAMS_ONLY, CheckpointDamaged
from transformers_jax.records import read_config
from transformers_jax.run_folder.runs import Run
from transformers_jax.tasks import task_data, task_for
from transformers_jax.train import members as members_lib
from transformers_jax.train import optim, resume, state as state_lib, step as step_lib
from transformers_jax.train_config import validate


def with_schedule(model_cfg, config):
  """The model config with the run's pipeline schedule (config.pipeline: what the stacks read
  under a mesh with `stage` > 1, modules/pipeline.py)."""
  pipe = config.get("pipeline") or {}
  return model_cfg.replace(
      pipeline_microbatches=int(pipe.get("microbatches", 0)),
      pipeline_repeats=int(pipe.get("repeats", 1)),
  )


class Setup:
  """A run's model config, task, mesh, logical-axis rules, optimizer and state layout, from its
  config alone (nothing allocated). `members` is None for a solo run, else the population's
  member table; `member_axis` the mesh axis the members are split over (or None)."""

  def __init__(self, config, task=None, devices=None):
    self.config = config
    self.model_cfg = with_schedule(ModelConfig.from_dict(config.model), config)
    self.task = task or task_for(self.model_cfg, config)
    field_checks.check_pipeline(config, self.model_cfg)
    self.mesh = parallel.make_mesh(config.mesh.to_dict(), devices)
    self.members = members_lib.members(config) if members_lib.enabled(config) else None
    count = len(self.members) if self.members else 1
    self.member_axis = members_lib.member_axis(self.mesh, count) if self.members else None
    rules = parallel.rules(config.rules.to_dict())
    self.rule_table = members_lib.without_axis(rules, self.member_axis)
    batch_axes = [a for a in parallel.BATCH_AXES if a != self.member_axis]
    validate(config, self.model_cfg, math.prod(self.mesh.shape[a] for a in batch_axes), self.task)
    field_checks.check_training(config, self.model_cfg, self.task, self.mesh.devices.flat)
    field_checks.check_pipeline(
        config, self.model_cfg, math.prod(self.mesh.shape[a] for a in batch_axes)
    )
    self.tx = optim.make_optimizer(config)
    abstract, shardings = state_lib.state_shardings(
        self.model_cfg, self.tx, self.mesh, self.rule_table, config.seed
    )
    self.solo_shardings = shardings  # one model's layout (a member's, for a population)
    if self.members:
      abstract, shardings = members_lib.population_shardings(
          abstract, shardings, self.members, self.member_axis
      )
    self.offload = state_lib.host_offload_parts(config)
    if self.offload and self.members:
      raise ValueError(
          f"host_offload={config.host_offload!r}: a population's members stay in device memory; "
          "leave host_offload empty or train one member"
      )
    self.abstract, self.shardings = abstract, state_lib.offloaded(shardings, self.offload)

  @property
  def frozen(self):
    """{name: parameters} of the Task's frozen runs (Task.frozen_runs: a teacher's), loaded on
    first use and placed on this run's mesh; None for most objectives."""
    if not hasattr(self, "_frozen"):
      named = self.task.frozen_runs(self.config)
      self._frozen = {k: self.frozen_params(v, k) for k, v in named.items()} if named else None
    return self._frozen

  def frozen_params(self, path: str, name: str = "frozen"):
    """The latest intact parameters of run `path` (the Task's frozen run `name`, e.g. the
    teacher), sharded over this mesh as that run's own model would be with this run's rules
    (the teacher's layout on the student's mesh)."""
    saved = read_config(pathlib.Path(path) / "config.json")
    if saved is None:
      raise UserError(f"{path}: no run there (no config.json): give a run's folder")
    model_cfg = ModelConfig.from_dict(saved["model"])
    try:
      params, _ = Run(path).load_params()
    except CheckpointDamaged as e:  # its fix ("use a new --workdir") is for the run in training
      raise UserError(
          f"the {name} run {path} is damaged, not this run's folder: {e.problem}; train the "
          f"{name} again, copy an intact checkpoint into {path}/checkpoints, or give another "
          f"{name} run, then run the same command again"
      ) from None
    except RunError as e:
      raise UserError(f"the {name} run {path}: {e}") from None
    params = block.in_layout(params, model_cfg.scan_layers)
    _, shardings = state_lib.state_shardings(
        model_cfg, optax.set_to_zero(), self.mesh, self.rule_table, 0
    )
    place = lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i])  # noqa: E731
    return jax.tree_util.tree_map(place, params, shardings.params)

  @property
  def member_count(self) -> int:
    return len(self.members) if self.members else 0

  # ------------------------------------------------------------------ layout
  def batch_sharding(self) -> NamedSharding:
    if self.members:
      return members_lib.stacked_batch_sharding(self.mesh, self.member_axis)
    return parallel.batch_sharding(self.mesh)

  def eval_batch_sharding(self) -> NamedSharding:
    """Held-out batches are shared by every member: rows over the batch axes left to them."""
    axes = tuple(a for a in parallel.BATCH_AXES if a != self.member_axis)
    return NamedSharding(self.mesh, P(axes))

  def abstract_batch(self) -> dict:
    """The train step's batch as sharded ShapeDtypeStructs ([M, B, ...] for a population)."""
    lead = (self.member_count,) if self.members else ()
    return {
        k: jax.ShapeDtypeStruct(lead + tuple(shape), dtype, sharding=self.batch_sharding())
        for k, (shape, dtype) in self.task.batch_shapes(self.model_cfg, self.config).items()
    }

  def abstract_state(self, scan_layers: bool | None = None):
    """The state as sharded ShapeDtypeStructs: a restore target, or a step's argument; with
    its blocks scanned or looped as `scan_layers` says (a checkpoint saved before a resume
    changed model.scan_layers), the model's layout when None."""
    if scan_layers is None or scan_layers == self.model_cfg.scan_layers:
      return state_lib.abstract_state(self.abstract, self.shardings)
    other = self.model_cfg.replace(scan_layers=scan_layers)
    abstract, shardings = state_lib.state_shardings(
        other, self.tx, self.mesh, self.rule_table, self.config.seed
    )
    if self.members:
      abstract, shardings = members_lib.population_shardings(
          abstract, shardings, self.members, self.member_axis
      )
    return state_lib.abstract_state(abstract, state_lib.offloaded(shardings, self.offload))

  def device_params(self, params):
    """`params` in device memory: a copy when config.host_offload keeps them in the host's."""
    return state_lib.on_device(params, self.shardings.params)

  def in_model_layout(self, state):
    """A restored state with its blocks in this model's layout (scanned or looped), moved
    inside jit onto this run's shardings when the checkpoint held the other one."""
    if block.stacked_blocks(state.params) in (None, self.model_cfg.scan_layers):
      return state
    axis = 1 if self.members else 0  # the layer axis comes after a population's member axis
    if self.offload:  # a restored state in host memory: relaid out in device memory
      held = jax.tree_util.tree_map(lambda x: x.sharding, state)
      move = lambda tree: block.relayout(state_lib.on_device(tree, held), self.abstract, axis)  # noqa: E731
    else:
      move = lambda tree: block.relayout(tree, self.abstract, axis)  # noqa: E731
    return jax.jit(move, out_shardings=self.shardings)(state)

  # ------------------------------------------------------------------ steps
  def train_step(self):
    if self.members:
      return members_lib.make_train_step(self, self.solo_shardings.params)
    return step_lib.make_train_step(
        self.task,
        self.model_cfg,
        self.config,
        self.tx,
        optim.schedule(self.config),
        self.mesh,
        self.rule_table,
        self.shardings,
        self.frozen,
    )

  def eval_step(self):
    if self.members:
      return members_lib.make_eval_step(self)
    return step_lib.make_eval_step(
        self.task, self.model_cfg, self.mesh, self.rule_table, self.shardings, self.frozen
    )

  # ------------------------------------------------------------------ data and state
  def data(self, workdir, seed: int | None = None):
    """The task's data for this run (for `seed`: a population member's batch stream)."""
    config = self.config
    if seed is not None and seed != config.seed:
      config = config.copy_and_resolve_references()
      config.seed = seed
    return task_data(self.task, config, self.model_cfg, workdir)

  def init_state(self):
    """A fresh state, initialised inside jit already sharded."""
    if self.members:
      return members_lib.init_state(self)
    state, _ = state_lib.create_state(
        self.model_cfg, self.tx, self.mesh, self.rule_table, self.config.seed, self.shardings
    )
    return state

  def start(self, checkpoints):
    """(state, first step, a note saying how it started): the newest intact checkpoint of the
    run, parameters of a parameters-only checkpoint (a converted model) with a fresh optimizer,
    parameters taken from `init_from`, or a fresh state."""
    start = checkpoints.latest_step()  # a fresh state is made only where one is used
    # the layout (scanned or looped blocks) each checkpoint holds, whatever the model's now
    stacked = lambda step: block.stacked_blocks(checkpoints.stored_tree(step))  # noqa: E731
    if start is not None and checkpoints.kind(start) == PARAMS_ONLY:  # e.g. a converted model
      state = self.init_state()
      target = {"params": self.abstract_state().params}
      if self.members or stacked(start) not in (None, self.model_cfg.scan_layers):
        # every member starts from the same parameters; or the blocks move to this layout
        params = checkpoints.restore(start, None)["params"]
        state, _ = self.copy_params(state, params)
      else:
        state = state.replace(params=checkpoints.restore(start, target)["params"])
      return (
          state,
          start,
          f"started from the parameters-only checkpoint at step {start} (fresh optimizer)",
      )
    if start is not None:
      held = "this population" if self.members else "this run's state"
      fix = (
          "resume with the population it was saved with"
          if self.members
          else "resume with the optimizer settings it was saved with (grad_clip, weight_decay …)"
      )
      state, start = resume.restore_verified(
          checkpoints,
          lambda step: self.abstract_state(stacked(step)),
          members_lib.non_finite_alive if self.members else resume.non_finite,
          does_not_fit=f"does not {'hold' if self.members else 'fit'} {held} ({{error}}): "
          f"{fix} or use a new --workdir",
      )
      if self.members:
        self.check_same_members(state, start, checkpoints)
      return self.in_model_layout(state), start, f"resumed from step {start}"
    state = self.init_state()
    if self.config.init_from:
      source = self.config.init_from
      params, src_step = resume.load_init_from(source, self.config.get("init_member", -1))
      source_cfg = Run(resume.init_from_run(source)).model_config()
      merge_note = ""
      if source_cfg.lora_rank and not lora.takes_adapters(source_cfg, self.model_cfg):
        # this model's adapters would not compute what the source's do (another rank, alpha
        # or targets; or none): the source's are folded into its kernels, and the model
        # starts as the adapted model it was
        params, _ = lora.merged(params, source_cfg)
        merge_note = (
            f"; its rank-{source_cfg.lora_rank} LoRA adapters were merged into the weights "
            f"(W + {source_cfg.lora_alpha / source_cfg.lora_rank:g} A B)"
        )
        if self.model_cfg.lora_rank:
          merge_note += f" and this model's rank-{self.model_cfg.lora_rank} adapters start fresh"
      state, (loaded, fresh) = self.copy_params(state, params)
      fresh_names = ", ".join(sorted({f.split("/")[0] for f in fresh})) or "-"
      if not loaded:
        raise UserError(
            f"init_from={source}: none of its {len(jax.tree_util.tree_leaves(params))} tensors "
            "matches this model's names and shapes: give a run of the same model family"
        )
      frozen = [f for f in fresh if not lora.is_trained(self.model_cfg, tuple(f.split("/")))]
      if frozen:  # random weights that LoRA would never train
        widened = source_cfg.vocab_size != self.model_cfg.vocab_size
        names = sorted({f.split("/")[0] for f in frozen})
        saved = ",".join(n for n in ("embed", "head") if n in names or f"lm_{n}" in names)
        raise UserError(
            f"init_from={source}: {', '.join(names)} "
            + (
                f"(model.vocab_size {source_cfg.vocab_size} there, {self.model_cfg.vocab_size} "
                "here) "
                if widened
                else ""
            )
            + "would start random and stay frozen, as LoRA trains only its adapters: add "
            f"--config.model.lora_modules_to_save={saved or 'embed,head'} to train them in full beside "
            "the adapters (or train without LoRA)"
        )
      member = self.config.get("init_member", -1)
      taken = f"step {src_step}"
      if member >= 0:  # say which member of the population was taken
        taken += f", {members_lib.chosen(resume.init_from_run(source), member)}"
      note = (
          f"initialised {len(loaded)} tensors from {source} ({taken}); "
          f"{len(fresh)} new: {fresh_names}{merge_note}"
      )
      return state, 0, note
    return state, 0, "fresh start"

  def copy_params(self, state, source):
    """(state with the parameters of `source` (one model's, host arrays) whose path and shape
    match, (names loaded, names left fresh)); a population's members all take them. Blocks
    stored in the other layout (scanned or looped) are moved to this model's first."""
    source = block.in_layout(source, self.model_cfg.scan_layers)
    if not self.members:
      params, loaded, fresh = resume.copy_matching(state.params, source)
      return state.replace(params=params), (loaded, fresh)
    count = self.member_count
    stacked = jax.tree_util.tree_map(
        lambda a: np.broadcast_to(np.asarray(a), (count, *np.shape(a))), source
    )
    params, loaded, fresh = resume.copy_matching(state.params, stacked)
    return state.replace(params=params), (loaded, fresh)

  def check_same_members(self, state, start, checkpoints) -> None:
    saved = jax.device_get(state.hparams)
    want = members_lib.hparam_arrays(self.members)
    if any(not np.array_equal(saved[k], want[k]) for k in want):
      raise UserError(
          f"checkpoint step {start} in {checkpoints.directory} holds other members (seeds "
          "or hyperparameters differ): resume with the population it was saved with, or "
          "use a new --workdir"
      )


@dataclasses.dataclass
class OpenedRun:
  """What both drivers (loop.py, population.py) start from, made by `open_run`."""

  datas: dict  # seed -> the task's data for that seed (a solo run: its one seed)
  data: Any  # the first seed's TaskData: held-out batches, tokenizer, summary, data source
  checkpoints: Any  # the run's CheckpointManager
  state: Any  # the train state to start from (fresh, resumed or initialised from a run)
  start: int  # the step it starts after
  note: str  # how it started, for the run's opening line
  train_step: Any
  eval_step: Any
  harness: TrainingHarness | None  # lm-eval tasks during training (config.eval_harness.every)
  writer: trackers.MetricsWriter  # metrics.jsonl, TensorBoard and W&B


def open_run(setup: Setup, run: Run, allow_data_change: bool) -> OpenedRun:
  """A run's opening, shared by the solo and population drivers: the run folder checked and
  written (a resume's changes recorded), each seed's data, the checkpoints, the starting
  state, the compiled-on-first-call steps, the harness and the metrics writer."""
  config, workdir = setup.config, run.path
  found, changes = resume.prepare_folder(run, config, allow_data_change)
  seeds = sorted({m["seed"] for m in setup.members}) if setup.members else [config.seed]
  datas = {seed: setup.data(workdir, seed) for seed in seeds}  # each as its solo run's
  data = datas[seeds[0]]
  if changes is not None:  # a resume: the files at data.path changed since the run read them
    changes.update(resume.data_source_changes(found, data.source, allow_data_change))
  resume.write_folder(run, config, changes, data.source)
  checkpoints = run.checkpoints(config.keep_checkpoints)
  state, start, note = setup.start(checkpoints)
  resume.note_changes(run, start, changes)
  harness = TrainingHarness(setup, data.tokenizer, workdir) if config.eval_harness.every else None
  is_main = jax.process_index() == 0
  writer = trackers.open_writer(config, workdir, is_main, members=setup.members)
  return OpenedRun(
      datas,
      data,
      checkpoints,
      state,
      start,
      note,
      setup.train_step(),
      setup.eval_step(),
      harness,
      writer,
  )
