"""Ahead-of-time check: compile the train step for the configured mesh without running it, and
report what XLA says it needs per device (memory) and costs (FLOPs) — before a run, not after."""

from __future__ import annotations

import json

import jax
import numpy as np

from transformers_jax import counting, parallel
from transformers_jax.config import ModelConfig
from transformers_jax.train import optim
from transformers_jax.train.step import abstract_state, make_train_step, state_shardings
from transformers_jax.train.tasks import task_name


def batch_shapes(task: str, model_cfg: ModelConfig, config) -> dict:
  B, T = config.batch_size, config.seq_len
  i32 = np.int32
  if task == "lm":
    return {"tokens": ((B, T + 1), i32)}
  if task == "mlm":
    return {"inputs": ((B, T), i32), "labels": ((B, T), i32), "weights": ((B, T), np.float32)}
  if task == "classify_text":
    return {"tokens": ((B, T), i32), "attention_mask": ((B, T), i32), "labels": ((B,), i32),
            "weights": ((B,), np.float32)}
  if task == "seq2seq":
    return {k: ((B, T), i32) for k in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask")}
  size, ch = model_cfg.image_size, model_cfg.num_channels
  return {"images": ((B, size, size, ch), np.float32), "labels": ((B,), i32),
          "weights": ((B,), np.float32)}


def synthetic_batch(task: str, model_cfg, config) -> dict:
  """Random inputs of the shapes the train step takes (ids within the vocabulary, labels within
  the classes, masks all ones), for benchmarks and profiles that time the step alone."""
  rng = np.random.default_rng(0)
  out = {}
  for key, (shape, dtype) in batch_shapes(task, model_cfg, config).items():
    if key in ("attention_mask", "src_mask", "tgt_mask"):
      out[key] = np.ones(shape, dtype)
    elif key == "weights":
      out[key] = (rng.random(shape) < (0.15 if task == "mlm" else 1.0)).astype(dtype)
    elif key == "labels" and task != "mlm":
      out[key] = rng.integers(0, model_cfg.num_classes, shape).astype(dtype)
    elif dtype == np.int32:
      out[key] = rng.integers(0, model_cfg.vocab_size, shape).astype(dtype)
    else:
      out[key] = rng.random(shape).astype(dtype)
  return out


def build_step(config):
  """Everything a train step needs, from the config alone: (step fn, abstract state, shardings,
  model config, mesh, task name). Nothing is allocated."""
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_name(model_cfg)
  mesh = parallel.make_mesh(config.mesh.to_dict())
  rules = parallel.rules(config.rules.to_dict())
  tx = optim.make_optimizer(config)
  abstract, shardings = state_shardings(model_cfg, tx, mesh, rules, config.seed)
  step = make_train_step(task, model_cfg, config, tx, optim.schedule(config), mesh, rules,
                         shardings)
  return step, abstract, shardings, model_cfg, mesh, task


def compile_train_step(config):
  """(compiled step, model config, mesh) from shapes alone: no parameter is allocated."""
  step, abstract, shardings, model_cfg, mesh, task = build_step(config)
  data = parallel.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=data)
           for k, (shape, dtype) in batch_shapes(task, model_cfg, config).items()}
  compiled = step.lower(abstract_state(abstract, shardings), batch).compile()
  return compiled, model_cfg, mesh


def report(config) -> dict:
  compiled, model_cfg, mesh = compile_train_step(config)
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  gib = 1024 ** 3
  out = {"mesh": dict(mesh.shape), "devices": jax.device_count(),
         "device": jax.devices()[0].device_kind, "params": counting.count(model_cfg)}
  if mem is not None:
    out.update({
        "per_device_argument_gib": mem.argument_size_in_bytes / gib,
        "per_device_output_gib": mem.output_size_in_bytes / gib,
        "per_device_temp_gib": mem.temp_size_in_bytes / gib,
        "per_device_generated_code_gib": mem.generated_code_size_in_bytes / gib,
        "per_device_alias_gib": mem.alias_size_in_bytes / gib,
    })
    out["per_device_peak_estimate_gib"] = (
        mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes) / gib
  if cost:
    out["xla_flops_per_device_per_step"] = float(cost.get("flops", 0.0))
  tokens = config.batch_size * (config.seq_len if model_cfg.family != "vit"
                                else model_cfg.seq_len_max)
  out["model_flops_per_step"] = counting.flops_per_token(
      model_cfg, config.seq_len if model_cfg.family != "vit" else None) * tokens
  print(json.dumps(out, indent=1))
  return out
