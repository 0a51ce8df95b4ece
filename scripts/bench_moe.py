"""Training-step speed of the MoE implementations side by side on this machine, as JSON.

    python scripts/bench_moe.py                       # experiments/mixtral.py:cpu, 20 steps
    python scripts/bench_moe.py --config experiments/mixtral.py:tiny --steps 10 \
        --impls=dense,ragged --config.batch_size=8

Builds the config's train step once per `model.moe_impl` (nothing else changes), compiles each,
then times their steps in turn (dense, ragged, dense, ...) on synthetic batches already on the
devices, so that a shared host's noise falls on both alike; reports each one's median step and
tokens/s, and each against the first (`speed_vs_first`). The dense reference keeps its
capacity_factor (its dropped choices are not computed); ragged is dropless.
"""

from __future__ import annotations

import json
import time

import numpy as np
from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError

FLAGS = cli.ScriptFlags(__doc__)
cli.define_config_flag(flag_values=FLAGS, default="experiments/mixtral.py:cpu")
flags.DEFINE_integer(
    "steps", 20, "Timed steps of each implementation.", lower_bound=1, flag_values=FLAGS
)
flags.DEFINE_list("impls", ["dense", "ragged"], "model.moe_impl values to time.", flag_values=FLAGS)


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  from transformers_jax.config import MOE_IMPLS

  config = FLAGS.config
  if config.model.feed_forward != "moe":
    raise UserError("--config: a mixture-of-experts model is needed (model.feed_forward=moe)")
  unknown = [i for i in FLAGS.impls if i not in MOE_IMPLS]
  if unknown or not FLAGS.impls:
    raise UserError(f"--impls={','.join(FLAGS.impls)}: choose from {', '.join(MOE_IMPLS)}")
  return timed(config)


def timed(config):
  import jax

  from transformers_jax.machine import parallel
  from transformers_jax.models import counting
  from transformers_jax.train.compile import build_step

  runs = {}
  for impl in FLAGS.impls:
    c = config.copy_and_resolve_references()
    c.model.moe_impl = impl
    setup = build_step(c)
    step = setup.train_step()
    state = setup.init_state()
    batch = parallel.put_batch(setup.task.synthetic_batch(setup.model_cfg, c), setup.mesh)
    t = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t
    state, m = step(state, batch)  # warm-up
    jax.block_until_ready(m)
    runs[impl] = {"step": step, "state": state, "batch": batch, "times": [], "compile": compile_s}
  for _ in range(FLAGS.steps):
    for run in runs.values():
      t = time.perf_counter()
      run["state"], m = run["step"](run["state"], run["batch"])
      jax.block_until_ready((run["state"], m))
      run["times"].append(time.perf_counter() - t)
      run["dropped"] = float(m["moe_dropped_fraction"])
  model_cfg = setup.model_cfg
  tokens = config.batch_size * setup.task.tokens_per_example(model_cfg, config)
  out = {
      "config": FLAGS["config"].config_filename,
      "params": counting.count(model_cfg),
      "num_experts": model_cfg.num_experts,
      "top_k": model_cfg.top_k,
      "capacity_factor": model_cfg.capacity_factor,
      "batch_size": config.batch_size,
      "seq_len": config.seq_len,
      "device": jax.devices()[0].device_kind,
      "devices": jax.device_count(),
      "steps": FLAGS.steps,
      "impls": {},
  }
  first = None
  for impl, run in runs.items():
    step_s = float(np.median(run["times"]))
    first = first or step_s
    out["impls"][impl] = {
        "compile_plus_first_step_s": round(run["compile"], 3),
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "speed_vs_first": first / step_s,
        "dropped_fraction": run["dropped"],
    }
  print(json.dumps(out))


if __name__ == "__main__":
  cli.run_script(main)
