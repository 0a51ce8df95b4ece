"""GPT-2 small and medium training steps on one GPU in bfloat16 with cuDNN attention: tokens/s and
MFU against the GPU's data-sheet peak (H200/H100: 989 TFLOP/s dense bf16), written to a JSON file.

    python scripts/bench_gpu.py [--presets small,medium] [--batch_size 16] [--seq_len 1024] \
        [--steps 20] [--out experiments/results/benchmarks/train_gpu_gpt2.json]

Each preset runs `scripts/bench_train.py` in its own process (a fresh device memory):
`--config experiments/gpt2.py:<preset>` with bfloat16 compute (float32 parameters and optimizer
state), `attention_impl=cudnn` (`jax.nn.dot_product_attention`'s cuDNN kernel, an error where
cuDNN cannot run it), dropout 0 and synthetic batches, timed after compiling as the median of
`--steps` steps. Without a GPU it stops with one line; `--allow_cpu` runs it anyway with XLA
attention (to try the script, not to measure a GPU).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FILE)  # checked before any work
flags.DEFINE_list("presets", ["small", "medium"], "GPT-2 presets to time.", flag_values=FLAGS)
flags.DEFINE_integer("batch_size", 16, "Sequences per step.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("seq_len", 1024, "Tokens per sequence.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer(
    "steps", 20, "Timed steps (the median is reported).", lower_bound=1, flag_values=FLAGS
)
flags.DEFINE_string(
    "out",
    str(ROOT / "experiments/results/benchmarks/train_gpu_gpt2.json"),
    "JSON file for the results.",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "allow_cpu",
    False,
    "Run without a GPU (XLA attention), to try the script.",
    flag_values=FLAGS,
)


def fail(message: str) -> None:
  raise UserError(message)


def main(argv=None) -> None:
  rest = cli.parse_script_flags(FLAGS, argv)
  if rest:
    fail(f"unexpected arguments {rest}: pass options as --flag=value")
  # this process only asks which backend there is: leave the GPU's memory to the benchmarks
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  import jax

  on_gpu = jax.default_backend() == "gpu"
  if not on_gpu and not FLAGS.allow_cpu:
    fail(
        f"no GPU (JAX's backend is {jax.default_backend()}): run this on a GPU machine, or "
        "pass --allow_cpu to try the script with XLA attention"
    )
  results = []
  for preset in FLAGS.presets:
    cmd = [
        sys.executable,
        str(ROOT / "scripts/bench_train.py"),
        "--config",
        f"experiments/gpt2.py:{preset}",
        f"--steps={FLAGS.steps}",
        f"--config.batch_size={FLAGS.batch_size}",
        f"--config.seq_len={FLAGS.seq_len}",
        f"--config.model.max_len={FLAGS.seq_len}",
        "--config.model.dropout=0.0",
        "--config.model.dtype=bfloat16",
        f"--config.model.attention_impl={'cudnn' if on_gpu else 'fused'}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
      lines = out.stderr.strip().splitlines() or ["(no output)"]
      fail(f"{preset}: bench_train.py failed: {lines[-1]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(preset=preset, dtype="bfloat16", attention="cudnn" if on_gpu else "xla")
    results.append(row)
    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
    print(
        f"gpt2 {preset}: {row['tokens_per_s']:,.0f} tokens/s, step {row['step_s'] * 1e3:.1f} ms, "
        f"MFU {mfu} of {row['peak_tflops_per_s'] or 0:.4g} TFLOP/s ({row['device']})"
    )
  pathlib.Path(FLAGS.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(FLAGS.out).write_text(
      json.dumps({"jax": jax.__version__, "runs": results}, indent=1)
  )
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  cli.run_script(main)
