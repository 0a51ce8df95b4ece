"""The lesson's "weakness is cost": time and memory of one attention layer as the sequence doubles.

    python scripts/lesson_attention_cost.py [--max_len 4096] [--d_model 256] [--heads 4]
        [--impl einsum] [--min_time 0.5] [--out experiments/results/lesson]

One causal self-attention layer of this project (`modules.attention.Attention`: q, k, v and output
projections around the attention core `--impl`, by default `einsum`, which writes the scores
out), batch 1, jit-compiled, forward pass. Time is the best of repeated calls (at least 3, for
about --min_time seconds); memory is XLA's scratch allocation for the compiled call
(`memory_analysis().temp_size_in_bytes`), next to the size of the H x T x T float32 score
matrix. Writes attention_cost.png and attention_cost.json to --out.

On a CPU, XLA materialises the score matrix (about twice over: scores and softmax weights), so
memory grows 4x per doubling; fused kernels (FlashAttention, cuDNN on a GPU) never store it and
grow linearly in memory, but their time is still quadratic: `--impl flash` shows this project's
blockwise attention doing so (scripts/bench_attention.py puts the implementations side by side,
forward and backward, and the whole train step).
"""

from __future__ import annotations

import json
import pathlib
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_integer("min_len", 128, "Shortest sequence.", flag_values=FLAGS)
flags.DEFINE_integer(
    "max_len", 4096, "Longest sequence (doubling from --min_len).", flag_values=FLAGS
)
flags.DEFINE_integer("d_model", 256, "Model width.", flag_values=FLAGS)
flags.DEFINE_integer("heads", 4, "Attention heads.", flag_values=FLAGS)
flags.DEFINE_string(
    "impl",
    "einsum",
    "Attention core (model.attention_impl), e.g. einsum or flash.",
    flag_values=FLAGS,
)
flags.DEFINE_float(
    "min_time",
    0.5,
    "Seconds of repeated calls per length (at least 3 calls; 0: just 3).",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "out",
    str(ROOT / "experiments" / "results" / "lesson"),
    "Folder for attention_cost.png and .json.",
    flag_values=FLAGS,
)


def measure(
    length: int, d_model: int, heads: int, min_time: float = 0.5, impl: str = "einsum"
) -> dict:
  import jax
  import jax.numpy as jnp
  from transformers_jax.config import ModelConfig
  from transformers_jax.modules.attention import Attention

  cfg = ModelConfig(
      family="decoder",
      d_model=d_model,
      num_heads=heads,
      max_len=length,
      positions="none",
      vocab_size=256,
      attention_impl=impl,
  )
  layer = Attention(cfg, causal=True)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, length, d_model), jnp.float32)
  params = jax.jit(layer.init)(jax.random.PRNGKey(1), x)  # one program, not one per op
  fn = jax.jit(lambda p, x: layer.apply(p, x))
  compiled = fn.lower(params, x).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  jax.block_until_ready(compiled(params, x))
  times, start = [], time.perf_counter()
  while len(times) < 3 or (time.perf_counter() - start < min_time and len(times) < 50):
    t = time.perf_counter()
    jax.block_until_ready(compiled(params, x))
    times.append(time.perf_counter() - t)
  return {
      "length": length,
      "time_s": min(times),
      "temp_bytes": int(temp),
      "score_matrix_bytes": heads * length * length * 4,
  }


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  T = [r["length"] for r in rows]
  fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
  for ax, key, scale, label in (
      (a, "time_s", 1e3, "forward time (ms)"),
      (b, "temp_bytes", 2**-20, "scratch memory (MiB)"),
  ):
    y = [r[key] * scale for r in rows]
    ax.loglog(T, y, "o-", base=2, label="measured")
    ax.loglog(T, [y[-1] * (t / T[-1]) ** 2 for t in T], "k:", base=2, label="∝ T² (through last)")
    ax.loglog(
        T, [y[-1] * (t / T[-1]) for t in T], "k--", base=2, lw=0.8, label="∝ T (through last)"
    )
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  b.loglog(
      T,
      [r["score_matrix_bytes"] * 2**-20 for r in rows],
      "s",
      base=2,
      mfc="none",
      label="H×T×T float32 scores",
  )
  b.legend(fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def main(argv=None) -> None:
  cli.parse_script_flags(FLAGS, argv)
  import jax

  device = jax.devices()[0]
  from transformers_jax.config import ATTENTION_IMPLS

  if FLAGS.impl not in ATTENTION_IMPLS:
    raise UserError(f"--impl={FLAGS.impl}: choose one of {', '.join(ATTENTION_IMPLS)}")
  print(
      f"one causal attention layer ({FLAGS.impl}), d_model {FLAGS.d_model}, {FLAGS.heads} heads, "
      f"batch 1, {device.platform} ({device.device_kind})"
  )
  print(f"{'T':>6} {'time':>10} {'x':>5} {'memory':>10} {'x':>5} {'H*T*T scores':>13}")
  rows, length = [], FLAGS.min_len
  while length <= FLAGS.max_len:
    r = measure(length, FLAGS.d_model, FLAGS.heads, FLAGS.min_time, FLAGS.impl)
    prev = rows[-1] if rows else None
    tx = f"{r['time_s'] / prev['time_s']:5.1f}" if prev else "    -"
    mx = f"{r['temp_bytes'] / max(prev['temp_bytes'], 1):5.1f}" if prev else "    -"
    print(
        f"{length:6} {r['time_s'] * 1e3:8.2f}ms {tx} {r['temp_bytes'] / 2**20:7.1f}MiB {mx} "
        f"{r['score_matrix_bytes'] / 2**20:10.1f}MiB",
        flush=True,
    )
    rows.append(r)
    length *= 2
  if FLAGS.impl in ("flash", "splash", "cudnn"):
    print("each doubling of T: time still grows up to 4x, memory only with the T-long activations")
  else:
    print("each doubling of T: the score matrix and, once it dominates, time and memory grow 4x")
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  meta = {
      "d_model": FLAGS.d_model,
      "heads": FLAGS.heads,
      "impl": FLAGS.impl,
      "batch": 1,
      "device": f"{device.platform} ({device.device_kind})",
      "rows": rows,
  }
  (out / "attention_cost.json").write_text(json.dumps(meta, indent=1) + "\n")
  plot(
      rows,
      out / "attention_cost.png",
      f"one attention layer ({FLAGS.impl}, d_model {FLAGS.d_model}, {FLAGS.heads} heads), "
      f"{meta['device']}",
  )
  print(f"wrote {out / 'attention_cost.png'} and attention_cost.json")


if __name__ == "__main__":
  cli.run_script(main)
