"""Training-step speed on this machine: tokens/s, step time and MFU, as JSON.

    python scripts/bench_train.py --config experiments/gpt2.py:tiny [--steps 20] [--config.x=y ...]
    python scripts/bench_train.py --config experiments/gpt2.py:tiny --config.model.d_model=256 \
        --config.model.num_layers=4 --config.model.num_heads=4 --config.seq_len=256 \
        --config.batch_size=16 --config.model.max_len=256

Times the jit-compiled train step alone (synthetic batches already on the devices, no data
pipeline, no logging) after compiling it; each step is timed on its own and the median is
reported (a shared host's noise moves the mean). MFU is model FLOPs (6N + attention, see
models/counting.py) over the device peak (for a CPU: the best of 20 float32 1024^3 matmuls).
`--free_attention_core` times the step without its attention core, a floor for any attention
implementation.
"""

from __future__ import annotations

import contextlib
import json
import time
from unittest import mock

import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
cli.define_config_flag(flag_values=FLAGS)
flags.DEFINE_integer(
    "steps",
    20,
    "Timed steps (after one compile step and one warm-up step).",
    lower_bound=1,
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "free_attention_core",
    False,
    "Diagnostic, not a model: replace softmax(q k^T) v by v, so the step times "
    "everything but the attention core (a floor for any attention kernel). "
    "Decoder family only.",
    flag_values=FLAGS,
)


def free_attention_core():
  """While active, attention's public `attend` returns v (its kv heads repeated to the query
  heads): the step without softmax(q k^T), for --free_attention_core."""
  import jax.numpy as jnp

  from transformers_jax.modules import attention

  def attend_nothing(q, k, v, *args, **kwargs):
    return jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)

  return mock.patch.object(attention, "attend", attend_nothing)


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  if FLAGS.config is None:
    raise UserError("--config is required, e.g. --config experiments/gpt2.py:tiny")
  config = FLAGS.config
  if FLAGS.free_attention_core and config.model.family != "decoder":
    raise UserError(
        "--free_attention_core: decoder family only (its attention is "
        "self-attention, where v has the output's shape)"
    )
  with free_attention_core() if FLAGS.free_attention_core else contextlib.nullcontext():
    return timed(config)


def timed(config):
  import jax

  from transformers_jax.machine import parallel
  from transformers_jax.models import counting, flops
  from transformers_jax.train import metrics as metrics_lib
  from transformers_jax.train.compile import build_step

  setup = build_step(config)
  step, model_cfg, mesh, task = setup.train_step(), setup.model_cfg, setup.mesh, setup.task
  state = setup.init_state()
  batch = parallel.put_batch(task.synthetic_batch(model_cfg, config), mesh)
  t = time.perf_counter()
  state, m = step(state, batch)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t
  state, m = step(state, batch)
  jax.block_until_ready(m)
  times = []
  for _ in range(FLAGS.steps):
    t = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready((state, m))
    times.append(time.perf_counter() - t)
  step_s = float(np.median(times))  # the median step: robust to a noisy neighbour on the host
  tokens_per_example = task.tokens_per_example(model_cfg, config)
  tokens = config.batch_size * tokens_per_example
  flops = flops.flops_per_token(model_cfg, tokens_per_example) * tokens
  peak, source = metrics_lib.device_peak()
  print(
      json.dumps(
          {
              "config": FLAGS["config"].config_filename,
              "family": model_cfg.family,
              "params": counting.count(model_cfg),
              "batch_size": config.batch_size,
              "seq_len": tokens_per_example,
              "device": jax.devices()[0].device_kind,
              "devices": jax.device_count(),
              "compile_plus_first_step_s": round(compile_s, 3),
              "step_s": step_s,
              "step_s_min": min(times),
              "step_s_max": max(times),
              "tokens_per_s": tokens / step_s,
              "model_tflops_per_s": flops / step_s / 1e12,
              "peak_tflops_per_s": peak / 1e12 if peak else None,
              "peak_source": source,
              "mfu": flops / step_s / peak if peak else None,
              "free_attention_core": FLAGS.free_attention_core,
          }
      )
  )


if __name__ == "__main__":
  cli.run_script(main)
