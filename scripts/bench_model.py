"""Model-library costs: counting GPT-3 175B, and compile time vs depth with and without scan.

    python scripts/bench_model.py [--layers 2,96] [--out FILE.json]

Prints one JSON object and a markdown table. Counting runs in a fresh process so its peak
resident memory is its own (the process's baseline after importing JAX is reported beside it).
Compile time is for a training-style forward + backward (jit(value_and_grad)) of a decoder with
d_model 128, 4 heads, sequence 64, batch 2, lowered from shapes only and compiled by XLA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work
cli.define_integer_list("layers", "2,96", "Depths whose compile time is measured.", FLAGS)
flags.DEFINE_string("out", "", "Also write the JSON to this file.", flag_values=FLAGS)

COUNT_175B = r"""
import json, resource, sys, time
sys.path.insert(0, ".")
import jax
from transformers_jax.models import counting
from transformers_jax.config import load_config_module
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = load_config_module("experiments/gpt3.py").get_config("175b")
t = time.perf_counter()
n = counting.count(cfg.model)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"params": n, "seconds": dt, "peak_rss_mb": peak / 1024,
                  "baseline_rss_mb": base / 1024}))
"""


def count_175b() -> dict:
  out = subprocess.run(
      [sys.executable, "-c", COUNT_175B], capture_output=True, text=True, check=True
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def compile_seconds(layers: int, scan: bool) -> float:
  import jax
  import jax.numpy as jnp

  from transformers_jax.config import ModelConfig
  from transformers_jax.models import build_model, param_shapes

  cfg = ModelConfig(
      num_layers=layers, d_model=128, num_heads=4, vocab_size=256, max_len=64, scan_layers=scan
  )
  model = build_model(cfg)
  params = param_shapes(cfg)
  tokens = jax.ShapeDtypeStruct((2, 64), jnp.int32)

  def loss(p, x):
    logits = model.apply({"params": p}, x)["logits"]
    return jnp.mean(jax.nn.logsumexp(logits, -1))

  start = time.perf_counter()
  jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()
  return time.perf_counter() - start


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  depths = FLAGS.layers
  import jax

  result = {
      "device": jax.devices()[0].device_kind,
      "jax": jax.__version__,
      "count_gpt3_175b": count_175b(),
      "compile_seconds": {},
  }
  for scan in (True, False):
    for layers in depths:
      result["compile_seconds"][f"{'scan' if scan else 'loop'}_{layers}"] = round(
          compile_seconds(layers, scan), 3
      )
  cs = result["compile_seconds"]
  lo, hi = depths[0], depths[-1]
  result["scan_ratio"] = cs[f"scan_{hi}"] / cs[f"scan_{lo}"]
  result["loop_ratio"] = cs[f"loop_{hi}"] / cs[f"loop_{lo}"]
  print(json.dumps(result))
  c = result["count_gpt3_175b"]
  print("\n| measurement | value |\n|---|---:|")
  print(
      f"| count GPT-3 175B ({c['params']:,} params) | {c['seconds']:.2f} s, peak RSS "
      f"{c['peak_rss_mb']:.0f} MB (after importing JAX: {c['baseline_rss_mb']:.0f} MB) |"
  )
  for key, secs in cs.items():
    print(f"| compile fwd+bwd, {key.replace('_', ', ')} layers | {secs:.2f} s |")
  print(f"| {hi} / {lo} layers, scanned | {result['scan_ratio']:.2f}x |")
  print(f"| {hi} / {lo} layers, looped | {result['loop_ratio']:.2f}x |")
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  cli.run_script(main)
