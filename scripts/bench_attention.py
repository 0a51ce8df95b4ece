"""Attention implementations side by side as the sequence grows: compiled memory and time.

    python scripts/bench_attention.py [--lengths 256,512,1024,2048,4096,8192]
        [--impls einsum,flash] [--block_q 512 --block_kv 512] [--steps 5]
        [--out experiments/results/attention]

For each length T and implementation (`model.attention_impl`), in one run so that both see the
same machine:
  - the attention core alone (`modules.attention.attend`, causal, batch 1, 4 heads of 16, as in
    GPT-2 tiny): XLA's temporaries for its compiled forward + backward
    (`memory_analysis().temp_size_in_bytes`) and the median time of that call;
  - the whole train step of GPT-2 tiny (experiments/gpt2.py:tiny, 2 layers of width 64, batch 1,
    T tokens): its compiled temporaries and median step time (synthetic batch on the device).
Prints one JSON object per measurement, then a markdown table, and writes attention.json,
attention.md and attention.png to --out. Splash (TPU Pallas) runs only in interpret mode off a
TPU, far too slow to time: give `--impls einsum,flash,splash` for its memory only.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
cli.define_integer_list("lengths", "256,512,1024,2048,4096,8192", "Sequence lengths.", FLAGS)
flags.DEFINE_list("impls", ["einsum", "flash"], "Attention implementations.", flag_values=FLAGS)
flags.DEFINE_integer(
    "block_q", 512, "flash / splash: queries per block.", lower_bound=8, flag_values=FLAGS
)
flags.DEFINE_integer(
    "block_kv", 512, "flash / splash: keys per block.", lower_bound=8, flag_values=FLAGS
)
flags.DEFINE_integer(
    "steps", 5, "Timed calls per measurement (after a warm-up).", lower_bound=1, flag_values=FLAGS
)
flags.DEFINE_bool("train_step", True, "Also time GPT-2 tiny's whole train step.", flag_values=FLAGS)
flags.DEFINE_string(
    "out",
    str(ROOT / "experiments" / "results" / "attention"),
    "Folder for attention.json, attention.md and attention.png.",
    flag_values=FLAGS,
)

HEADS, HEAD_DIM = 4, 16  # GPT-2 tiny's attention


def time_side_by_side(fns: dict, steps: int) -> dict:
  """{name: (median, min) seconds}: the calls alternate (a, b, a, b, ...) so that a busy
  neighbour on the host slows every implementation alike."""
  import jax

  times = {name: [] for name in fns}
  for fn in fns.values():
    jax.block_until_ready(fn())  # warm-up
  for _ in range(steps):
    for name, fn in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - t)
  return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def attention_core(impl: str, length: int):
  """Forward + backward of one causal attention core, batch 1."""
  import jax
  import jax.numpy as jnp

  from transformers_jax.modules.attention import attend

  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(kk, (1, length, HEADS, HEAD_DIM)) for kk in keys)

  def loss(q, k, v):
    out = attend(q, k, v, None, True, impl=impl, block_q=FLAGS.block_q, block_kv=FLAGS.block_kv)
    return jnp.sum(out * out)

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
  row = {
      "what": "attention fwd+bwd",
      "impl": impl,
      "length": length,
      "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
  }
  return row, lambda: compiled(q, k, v)


def train_step(impl: str, length: int):
  """GPT-2 tiny's train step at `length` tokens, batch 1."""
  from transformers_jax.machine import parallel
  from transformers_jax.config import load_config_module
  from transformers_jax.train import optim
  from transformers_jax.train.compile import build_step
  from transformers_jax.train.state import create_state

  config = load_config_module(str(ROOT / "experiments" / "gpt2.py")).get_config("tiny")
  config.model.update(
      max_len=length,
      attention_impl=impl,
      attention_block_q=FLAGS.block_q,
      attention_block_kv=FLAGS.block_kv,
  )
  config.update(seq_len=length, batch_size=1)
  step, _, _, model_cfg, mesh, task = build_step(config)
  tx = optim.make_optimizer(config)
  state, _ = create_state(model_cfg, tx, mesh, parallel.rules(config.rules.to_dict()), config.seed)
  batch = parallel.put_batch(task.synthetic_batch(model_cfg, config), mesh)
  compiled = step.lower(state, batch).compile()
  row = {
      "what": "GPT-2 tiny train step",
      "impl": impl,
      "length": length,
      "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
  }
  holder = {"state": state}

  def run():
    holder["state"], metrics = compiled(holder["state"], batch)
    return metrics

  return row, run


def markdown(rows: list[dict], impls: list[str]) -> str:
  lines = []
  for what in dict.fromkeys(r["what"] for r in rows):
    sub = [r for r in rows if r["what"] == what]
    lengths = sorted({r["length"] for r in sub})
    cell = {(r["impl"], r["length"]): r for r in sub}
    head = ["T"] + [f"{i} time (ms)" for i in impls] + [f"{i} temp (MiB)" for i in impls]
    if "einsum" in impls and "flash" in impls:
      head.append("flash / einsum time")
    lines += [f"**{what}**", "", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for length in lengths:
      row = [str(length)]
      for i in impls:
        t = cell.get((i, length), {}).get("time_s")
        row.append(f"{t * 1e3:.1f}" if t is not None else "-")
      for i in impls:
        m = cell.get((i, length), {}).get("temp_bytes")
        row.append(f"{m / 2**20:.1f}" if m is not None else "-")
      if "einsum" in impls and "flash" in impls:
        e, f = (cell.get((i, length), {}).get("time_s") for i in ("einsum", "flash"))
        row.append(f"{f / e:.2f}" if e and f else "-")
      lines.append("| " + " | ".join(row) + " |")
    lines.append("")
  return "\n".join(lines)


def plot(rows: list[dict], impls: list[str], path: pathlib.Path, title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  whats = list(dict.fromkeys(r["what"] for r in rows))
  fig, axes = plt.subplots(len(whats), 2, figsize=(9, 3.4 * len(whats)), squeeze=False)
  for (a, b), what in zip(axes, whats):
    for impl in impls:
      sub = sorted(
          (r for r in rows if r["what"] == what and r["impl"] == impl), key=lambda r: r["length"]
      )
      timed = [r for r in sub if "time_s" in r]
      if timed:
        a.loglog(
            [r["length"] for r in timed],
            [r["time_s"] * 1e3 for r in timed],
            "o-",
            base=2,
            label=impl,
        )
      b.loglog(
          [r["length"] for r in sub],
          [r["temp_bytes"] / 2**20 for r in sub],
          "o-",
          base=2,
          label=impl,
      )
    for ax, label in ((a, "time (ms)"), (b, "compiled temporaries (MiB)")):
      ax.set_title(what, fontsize=9)
      ax.set_xlabel("sequence length T")
      ax.set_ylabel(label)
      ax.grid(alpha=0.3, which="both")
      ax.legend(fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def main(argv=None) -> None:
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  from transformers_jax.config import ATTENTION_IMPLS

  impls = [i.strip() for i in FLAGS.impls]
  for impl in impls:
    if impl not in ATTENTION_IMPLS:
      raise UserError(f"--impls: {impl!r} is not one of {', '.join(ATTENTION_IMPLS)}")
  lengths = FLAGS.lengths
  if any(n < 8 for n in lengths):
    raise UserError(f"--lengths={','.join(map(str, lengths))}: every length must be >= 8")
  import jax

  device = jax.devices()[0]
  rows = []
  for length in lengths:
    for make in (attention_core, train_step) if FLAGS.train_step else (attention_core,):
      made = {impl: make(impl, length) for impl in impls}
      timed = {
          impl: fn
          for impl, (_, fn) in made.items()
          if impl != "splash" or jax.default_backend() == "tpu"
      }
      times = time_side_by_side(timed, FLAGS.steps)
      for impl, (row, _) in made.items():
        if impl in times:
          row["time_s"], row["time_s_min"] = times[impl]
        print(json.dumps(row), flush=True)
        rows.append(row)
      del made, timed
  table = markdown(rows, impls)
  print(table)
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  meta = {
      "device": f"{device.platform} ({device.device_kind})",
      "block_q": FLAGS.block_q,
      "block_kv": FLAGS.block_kv,
      "steps": FLAGS.steps,
      "rows": rows,
  }
  (out / "attention.json").write_text(json.dumps(meta, indent=1) + "\n")
  (out / "attention.md").write_text(
      f"Attention implementations on {meta['device']}, blocks {FLAGS.block_q} x "
      f"{FLAGS.block_kv}, median of {FLAGS.steps} calls alternating between the implementations (scripts/bench_attention.py).\n\n"
      + table
  )
  plot(rows, impls, out / "attention.png", f"attention against T, {meta['device']}")
  print(f"wrote {out / 'attention.png'}, attention.json and attention.md")


if __name__ == "__main__":
  cli.run_script(main)
