"""Settings that are valid on their own but mean nothing for the model or task they are given
to: refused with one line (a ValueError naming the field and the fix) before anything is built,
rather than ignored. ModelConfig's own checks (config/checks.py) run on every load of a saved run;
these run where a model is trained or counted, so that a run saved before them still loads."""

from __future__ import annotations

import dataclasses

from transformers_jax.train_config import config_value

from transformers_jax.evaluate.harness import Settings
from transformers_jax.modules import lora, quantization
from transformers_jax.modules.norms import unread_norm_fields
from transformers_jax.train import trackers

# Training fields that only the seq2seq task (an encoder_decoder model) reads, with the value
# that means "not set".
SEQ2SEQ_DATA_FIELDS = {"source_len": 0, "eval_translations": 0}


def model_depth(model_cfg) -> int:
  """Blocks in the model's deepest stack (the encoder's or the decoder's, for encoder_decoder)."""
  if model_cfg.family == "encoder_decoder":
    return max(model_cfg.encoder_layers, model_cfg.decoder_layers)
  return model_cfg.num_layers


def check_model(model_cfg) -> None:
  """MoE settings that would leave a model without experts, or that a dense model ignores;
  LoRA targets given to a model without LoRA; a note for each norm setting no norm reads (a
  config file's: the command line's are refused while the flags are parsed,
  cli.unread_setting_given)."""
  c = model_cfg
  check_lora(c)
  for field, why, _ in unread_norm_fields(c):
    print(f"note: model.{field}={getattr(c, field)!r} is not used: {why}", flush=True)
  if c.feed_forward != "moe":
    if c.moe_impl != "dense":
      raise ValueError(
          f"model.moe_impl={c.moe_impl!r}: says how tokens reach their experts, and this model "
          f"has feed_forward={c.feed_forward!r} (no experts): add "
          "--config.model.feed_forward=moe, or leave moe_impl at 'dense'"
      )
    return
  depth = model_depth(c)
  if c.moe_every > depth:
    n, allowed = c.moe_every, "1" if depth == 1 else f"1 to {depth}"
    raise ValueError(
        f"model.moe_every={n}: blocks {n}, {2 * n}, ... are MoE and the deepest stack has "
        f"{depth} block(s), so none would be and the model would be dense: use moe_every="
        f"{allowed}, or feed_forward=dense"
    )


def check_lora(model_cfg) -> None:
  """model.lora_targets other than its default on a model with lora_rank=0, which has no
  adapters for them to place."""
  c = model_cfg
  default = next(f.default for f in dataclasses.fields(c) if f.name == "lora_targets")
  if c.lora_modules_to_save and not c.lora_rank:
    raise ValueError(
        f"model.lora_modules_to_save={c.lora_modules_to_save!r}: trains modules in full beside "
        "LoRA's adapters, and model.lora_rank is 0 (everything trains): set a rank or leave it "
        "empty"
    )
  if c.lora_rank or sorted(lora.target_names(c)) == sorted(default.split(",")):
    return
  raise ValueError(
      f"model.lora_targets={c.lora_targets!r}: read only with model.lora_rank > 0: set a rank "
      f"(e.g. --config.model.lora_rank=8) or leave lora_targets at its default ({default})"
  )


def check_training(config, model_cfg, task, devices) -> None:
  """check_model, and the training fields that mean nothing for this task (a Task: those it
  reads are its `reads_fields`) or these devices."""
  check_model(model_cfg)
  data = config.get("data")
  task_name = task.name
  for field, unset in SEQ2SEQ_DATA_FIELDS.items():
    value = data.get(field, unset) if data is not None else unset
    if value != unset and f"data.{field}" not in task.reads_fields:
      raise ValueError(
          f"data.{field}={value!r}: only a seq2seq model (family encoder_decoder) reads it, and "
          f"this {model_cfg.family} model trains the {task_name} task: leave it out (or "
          f"{unset})"
      )
  context = int(config.get("mesh", {}).get("context", 1))
  if model_cfg.context_strategy != "all_gather" and context == 1:
    raise ValueError(
        f"model.context_strategy={model_cfg.context_strategy!r}: says how the devices of "
        "mesh.context share keys and values, and mesh.context=1 (no sequence is split): set "
        "--config.mesh.context to 2 or more, or leave context_strategy at all_gather"
    )
  check_attention_platform(model_cfg, devices)
  quantization.platform_check(model_cfg, devices)
  check_tracking(config, model_cfg)
  check_host_offload(config, devices)


def check_pipeline(config, model_cfg, data_shards: int | None = None) -> None:
  """mesh.stage > 1 (modules/pipeline.py): a solo run of a scanned stack whose blocks split
  evenly over the stages (times the circular schedule's repeats), microbatches that split the
  batch (each over the `data_shards` batch devices); pipeline fields set without stages."""
  from transformers_jax.modules.block import scan_runs
  from transformers_jax.modules.pipeline import schedule_problem
  from transformers_jax.train.members import enabled

  for field, unset in (("microbatches", 0), ("repeats", 1)):
    given = config.model.get(f"pipeline_{field}", unset)
    if given != unset:
      raise ValueError(
          f"model.pipeline_{field}={given}: training sets it from pipeline.{field}: give "
          f"--config.pipeline.{field}={given} instead"
      )
  stages = int(config.mesh.get("stage", 1)) * int(config.mesh.get("dcn_stage", 1))
  pipe = config.get("pipeline") or {}
  count, repeats = int(pipe.get("microbatches", 0)), int(pipe.get("repeats", 1))
  if stages == 1:
    for field, value, unset in (("microbatches", count, 0), ("repeats", repeats, 1)):
      if value != unset:
        raise ValueError(
            f"pipeline.{field}={value}: schedules pipeline stages, and mesh.stage=1 (none): set "
            f"--config.mesh.stage to 2 or more, or leave pipeline.{field} at {unset}"
        )
    return
  where = f"mesh.stage={stages}"
  if enabled(config):
    raise ValueError(
        f"{where}: a population's members are vmapped over one program, which is not "
        "pipelined: train one member (no population settings) or set --config.mesh.stage=1"
    )
  if not model_cfg.scan_layers:
    raise ValueError(
        f"{where}: the stages hold a scanned stack's blocks (one `layers` axis to split): set "
        "--config.model.scan_layers=true"
    )
  if model_cfg.family == "decoder" and len(scan_runs(model_cfg, model_cfg.num_layers)) > 1:
    raise ValueError(
        f"{where}: the stages split one scanned run of like blocks, and these blocks alternate "
        "dense and MoE (model.moe_every, model.moe_first_dense): set --config.mesh.stage=1"
    )
  stacks = (model_cfg.encoder_layers, model_cfg.decoder_layers)
  for depth in stacks if model_cfg.family == "encoder_decoder" else (model_cfg.num_layers,):
    problem = schedule_problem(depth, stages, count, repeats)
    if problem:
      raise ValueError(f"{problem[0]}={config_value(config, problem[0])}: {problem[1]}")
  if data_shards is None:  # the batch is checked once the mesh says how it splits
    return
  microbatches = count or stages
  rows = config.batch_size // config.grad_accum_steps
  per = microbatches * data_shards
  if rows % per:
    shards = f" x {data_shards} data-parallel shards" if data_shards > 1 else ""
    raise ValueError(
        f"pipeline.microbatches={microbatches}: the batch of {rows} examples"
        + (" per accumulation step" if config.grad_accum_steps > 1 else "")
        + f" does not split into {microbatches} microbatches{shards}: make batch_size"
        + (" / grad_accum_steps" if config.grad_accum_steps > 1 else "")
        + f" a multiple of {per}, or change pipeline.microbatches"
    )


def check_host_offload(config, devices) -> None:
  """host_offload names parts of the train state, and the devices have pinned host memory."""
  from transformers_jax.train.state import HOST_OFFLOAD, host_offload_parts

  parts = host_offload_parts(config)
  unknown = [p for p in parts if p not in HOST_OFFLOAD]
  if unknown:
    raise ValueError(
        f"host_offload={config.host_offload!r}: {unknown[0]!r} is no part of the train state "
        "that can live in host memory: name optimizer, params or both (optimizer,params)"
    )
  if not parts or not len(devices):
    return
  try:
    kinds = {m.kind for m in devices[0].addressable_memories()}
  except Exception:  # noqa: BLE001 - a compile-only topology's devices: their compiler decides
    return
  if "pinned_host" not in kinds:
    raise ValueError(
        f"host_offload={config.host_offload!r}: {devices[0].platform} devices have no pinned "
        f"host memory (only {', '.join(sorted(kinds))}): leave host_offload empty"
    )


def check_attention_platform(model_cfg, devices) -> None:
  """attention_impl=cudnn names the devices the step compiles for (a TPU topology compiled from
  a CPU host included), not the host's own backend."""
  if model_cfg.attention_impl != "cudnn" or not len(devices):
    return
  device = devices[0]
  if device.platform in ("gpu", "cuda"):
    return
  kind = getattr(device, "device_kind", "") or device.platform
  named = device.platform + (f" ({kind} devices)" if kind.lower() != device.platform else "")
  best = "splash on a TPU" if device.platform == "tpu" else "the platform's best"
  raise ValueError(
      f"model.attention_impl='cudnn' needs an NVIDIA GPU, and this step compiles for {named}: "
      f"use auto ({best}), flash or einsum"
  )


def check_tracking(config, model_cfg) -> None:
  """The wandb.* fields are ones W&B takes, and none is set without wandb.project (trackers);
  the harness settings (when it runs) have a meaning."""
  trackers.check_fields(config)
  trackers.check_unread(config)
  harness = config.get("eval_harness")
  if harness is None:
    return
  if harness.every < 0:
    raise ValueError(f"eval_harness.every={harness.every}: must be >= 0 (0 turns it off)")
  problem = Settings.from_config(harness).problem()
  if problem:
    raise ValueError(f"eval_harness.{problem}")
  if not harness.every:
    return
  if not [t for t in harness.tasks.split(",") if t.strip()]:
    raise ValueError(
        f"eval_harness.every={harness.every} but eval_harness.tasks is empty: name lm-eval "
        "tasks, e.g. --config.eval_harness.tasks=pysyntax_choice with --config.eval_harness."
        "include_path=experiments/eval_tasks, or set every=0"
    )
  if model_cfg.family != "decoder":
    raise ValueError(
        f"eval_harness.every={harness.every}: the harness scores decoder-only language models, "
        f"not model.family={model_cfg.family}; set --config.eval_harness.every=0"
    )
