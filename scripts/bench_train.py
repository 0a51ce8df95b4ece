"""Training-step speed on this machine: tokens/s, step time and MFU, as JSON.

    python scripts/bench_train.py --config experiments/gpt2.py:tiny [--steps 20] [--config.x=y ...]
    python scripts/bench_train.py --config experiments/gpt2.py:tiny --config.model.d_model=256 \
        --config.model.num_layers=4 --config.model.num_heads=4 --config.seq_len=256 \
        --config.batch_size=16 --config.model.max_len=256

Times the jit-compiled train step alone (synthetic batches already on the devices, no data
pipeline, no logging) after compiling it; MFU is model FLOPs (6N + attention, see counting.py)
over the device peak (for a CPU: a measured float32 matmul).
"""

from __future__ import annotations

import json
import time

import jax
import numpy as np
from absl import flags

from transformers_jax import cli, counting, parallel
from transformers_jax.config import ModelConfig
from transformers_jax.models import example_inputs
from transformers_jax.train import metrics as metrics_lib
from transformers_jax.train import optim
from transformers_jax.train.step import create_state, make_train_step
from transformers_jax.train.tasks import task_name

cli.define_config_flag()
flags.DEFINE_integer("steps", 20, "Timed steps (after one compile step and one warm-up step).")
FLAGS = flags.FLAGS


def synthetic_batch(task: str, model_cfg: ModelConfig, config) -> dict:
  rng = np.random.default_rng(0)
  B, T, V = config.batch_size, config.seq_len, model_cfg.vocab_size
  if task == "lm":
    return {"tokens": rng.integers(0, V, (B, T + 1), dtype=np.int32)}
  if task == "mlm":
    return {"inputs": rng.integers(0, V, (B, T), dtype=np.int32),
            "labels": rng.integers(0, V, (B, T), dtype=np.int32),
            "weights": (rng.random((B, T)) < 0.15).astype(np.float32)}
  if task == "classify_text":
    return {"tokens": rng.integers(0, V, (B, T), dtype=np.int32),
            "attention_mask": np.ones((B, T), np.int32),
            "labels": rng.integers(0, model_cfg.num_classes, B, dtype=np.int32),
            "weights": np.ones(B, np.float32)}
  if task == "seq2seq":
    ids = lambda: rng.integers(0, V, (B, T), dtype=np.int32)  # noqa: E731
    return {"src": ids(), "tgt_in": ids(), "tgt_out": ids(), "src_mask": np.ones((B, T), np.int32),
            "tgt_mask": np.ones((B, T), np.int32)}
  images = example_inputs(model_cfg, B)[0]
  return {"images": rng.random(images.shape, dtype=np.float32),
          "labels": rng.integers(0, model_cfg.num_classes, B, dtype=np.int32),
          "weights": np.ones(B, np.float32)}


def main(argv):
  config = FLAGS.config
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_name(model_cfg)
  mesh = parallel.make_mesh(config.mesh.to_dict())
  rules = parallel.rules(config.rules.to_dict())
  tx = optim.make_optimizer(config)
  state, shardings = create_state(model_cfg, tx, mesh, rules, config.seed)
  step = make_train_step(task, model_cfg, config, tx, optim.schedule(config), mesh, rules,
                         shardings)
  batch = parallel.put_batch(synthetic_batch(task, model_cfg, config), mesh)
  t = time.perf_counter()
  state, m = step(state, batch)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t
  state, m = step(state, batch)
  jax.block_until_ready(m)
  t = time.perf_counter()
  for _ in range(FLAGS.steps):
    state, m = step(state, batch)
  jax.block_until_ready((state, m))
  step_s = (time.perf_counter() - t) / FLAGS.steps
  tokens_per_example = config.seq_len if model_cfg.family != "vit" else model_cfg.seq_len_max
  tokens = config.batch_size * tokens_per_example
  flops = counting.flops_per_token(model_cfg, tokens_per_example) * tokens
  peak, source = metrics_lib.device_peak()
  print(json.dumps({
      "config": flags.FLAGS["config"].config_filename, "family": model_cfg.family,
      "params": counting.count(model_cfg), "batch_size": config.batch_size,
      "seq_len": tokens_per_example, "device": jax.devices()[0].device_kind,
      "devices": jax.device_count(), "compile_plus_first_step_s": round(compile_s, 3),
      "step_s": step_s, "tokens_per_s": tokens / step_s,
      "model_tflops_per_s": flops / step_s / 1e12,
      "peak_tflops_per_s": peak / 1e12 if peak else None, "peak_source": source,
      "mfu": flops / step_s / peak if peak else None}))


if __name__ == "__main__":
  cli.run(main)
