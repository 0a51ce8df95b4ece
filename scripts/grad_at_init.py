"""Per-layer gradient norms at initialisation, by norm placement and depth (no training).

    python scripts/grad_at_init.py --out experiments/results/deep_postnorm/grad_at_init \
        [--depths 6,12,24,48] [--placements pre,post,sandwich] [--seeds 3] [--tasks lm,translation]

After Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture"), whose
analysis says that at initialisation the gradient of the feed-forward weights near the output of
a post-norm Transformer is large and does not shrink with depth L, while a pre-norm one's
shrinks roughly as 1/sqrt(L). For every task, placement, depth and seed this script initialises
the model (the sweeps' own tiny models: experiments/deep_postnorm.py for the LM,
experiments/deep_postnorm_translation.py for translation), takes one
training batch of that seed's data stream, and computes the gradient of the mean token loss. It
writes, per block of every stack (the decoder for the LM; encoder and decoder for translation):

  grad_norms.jsonl   one line per (task, placement, depth, seed): per stack, per layer, the L2
                     norm of the gradient of the feed-forward kernels (`ffn`: wi and wo, the
                     paper's W^FFN), of the attention kernels (`attn`: self- and cross-attention
                     query, key, value, out) and of all the block's parameters (`block`)
  table.md           the last block's `ffn` norm per depth (seed mean and min-max), its ratio
                     to the first block's, and the fitted exponent a of norm ~ L^a across depths
  grad_vs_layer.png  `ffn` gradient norm against layer index, one column per depth, one row per
                     stack; seed mean with a min-max band, log scale

Layers are scanned (`model.scan_layers`), so each (task, placement, depth) compiles once and
every seed reuses it; the whole default grid takes a few minutes on a 2-core CPU.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps
from transformers_jax.modules.placements import PLACEMENTS

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_list("depths", ["6", "12", "24", "48"], "Blocks per stack.", flag_values=FLAGS)
flags.DEFINE_list(
    "placements",
    ["pre", "post", "sandwich"],
    "model.norm_placement values, or all (every built placement).",
    flag_values=FLAGS,
)
flags.DEFINE_integer("seeds", 3, "Seeds 0..N-1 (initialisation and batch).", flag_values=FLAGS)
flags.DEFINE_list("tasks", ["lm", "translation"], "lm and/or translation.", flag_values=FLAGS)
flags.DEFINE_integer("d_model", 0, "Width; 0 = the sweep's width per task.", flag_values=FLAGS)
flags.DEFINE_integer(
    "batch_size", 16, "Rows of the batch the gradient is taken on.", flag_values=FLAGS
)
flags.DEFINE_float(
    "init_std",
    0.0,
    "model.init_std for every weight; 0 = the sweeps' (0.02). Xiong et al. analyse Xavier "
    "initialisation, about 1/sqrt(d_model) for these square layers.",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "init",
    "",
    "model.init for every model ('' = the sweeps', gpt2): xavier is Xiong et al.'s setting, "
    "paper each placement's own paper's.",
    flag_values=FLAGS,
)
flags.DEFINE_bool("report_only", False, "Rewrite table and plot from the jsonl.", flag_values=FLAGS)

# every built norm placement (modules/placements/), pre/post/sandwich in their usual colours
BUILT_PLACEMENTS = [n for n, p in PLACEMENTS.items() if not p.unavailable]
PLACEMENT_COLORS = {
    name: f"C{i}" if i < 10 else ("tab:olive", "tab:cyan", "k", "m", "y", "g", "b", "r")[i % 8]
    for i, name in enumerate(
        ["pre", "post", "sandwich"]
        + [n for n in BUILT_PLACEMENTS if n not in ("pre", "post", "sandwich")]
    )
}
GROUPS = ("ffn", "attn", "block")


SWEEPS = {  # the sweep each task's model comes from
    "lm": "experiments/deep_postnorm.py",
    "translation": "experiments/deep_postnorm_translation.py",
}
# The probe's translation batches are numbers up to 999 in rows of 32 (the data of the first
# translation sweep, on which the committed probe results were measured); the sweep itself moved
# to numbers up to 9,999 (for BLEU-4) with shorter source rows and more held-out translations.
PROBE_DATA = {
    "translation": {
        "data.max_number": 999,
        "seq_len": 32,
        "model.max_len": 32,
        "data.source_len": 0,
        "data.eval_translations": 0,
    }
}


def task_config(
    task: str,
    placement: str,
    depth: int,
    seed: int,
    d_model: int,
    batch_size: int,
    init_std: float = 0.0,
    init: str = "",
):
  """The model `task`'s sweep trains (its BASE with its COMMON fields) at this placement and
  depth, layers scanned, on a batch of `batch_size` rows of seed `seed`'s stream."""
  sweep = sweeps.load_sweep(sweeps.ROOT / SWEEPS[task], ("BASE", "COMMON", "populations"))
  config = sweeps.base_config(sweep)
  overrides = {
      **{k: v for k, v in sweep.COMMON.items() if k.startswith(("model.", "data.", "seq_len"))},
      **PROBE_DATA.get(task, {}),
      "model.norm_placement": placement,
      "model.num_layers": depth,
      "model.scan_layers": True,
      "model.dropout": 0.0,
      "seed": seed,
      "batch_size": batch_size,
  }
  if d_model:
    overrides["model.d_model"] = d_model
  if init_std:
    overrides["model.init_std"] = init_std
  if init:
    overrides["model.init"] = init
  config.update_from_flattened_dict(overrides)
  return config


def group_of(path: tuple[str, ...]) -> tuple[str, ...]:
  """The groups a block parameter (its path inside the block) counts towards."""
  kernel = path[-1] == "kernel"
  if path[0] == "ffn" and kernel:
    return ("ffn", "block")
  if path[0] in ("self_attn", "cross_attn") and kernel:
    return ("attn", "block")
  return ("block",)


def layer_norms(grads) -> dict:
  """{stack: {group: [norm per layer]}} from the gradient tree of a scanned model."""
  import jax
  import jax.numpy as jnp

  out = {}
  for stack in ("encoder", "decoder"):
    if stack not in grads:
      continue
    sums = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(grads[stack]["layers"])[0]:
      names = tuple(getattr(k, "key", str(k)) for k in path)
      per_layer = jnp.sum(jnp.square(leaf.reshape(leaf.shape[0], -1)), axis=1)
      for g in group_of(names):
        sums[g] = sums.get(g, 0.0) + per_layer
    out[stack] = {g: jnp.sqrt(sums[g]) for g in GROUPS}
  return out


def probe(
    task: str,
    placement: str,
    depth: int,
    seeds: int,
    d_model: int,
    batch_size: int,
    data_dir,
    init_std: float = 0.0,
    init: str = "",
):
  """One record per seed: per-layer gradient norms at initialisation."""
  import jax
  from flax import linen as nn

  from transformers_jax.models import initializer
  from transformers_jax.train import step as step_lib
  from transformers_jax.train.setup import Setup

  config = task_config(task, placement, depth, 0, d_model, batch_size, init_std, init)
  config.data.cache_dir = str(data_dir)
  config.eval_batches = 1  # the held-out set is not used; the smallest one is built
  setup = Setup(config)
  loss_fn = step_lib.make_loss_fn(setup.task, setup.model_cfg, 0.0, 0.0)

  def mean_loss(params, batch, rng):
    objective, sums = loss_fn(params, batch, rng)
    return objective / sums["weight"]

  boxed_params = initializer(setup.model_cfg)

  @jax.jit
  def init_and_probe(seed, batch):
    key = jax.random.PRNGKey(seed)
    with nn.logical_axis_rules(setup.rule_table):  # the parameters a run of this seed starts from
      params = nn.unbox(boxed_params(jax.random.fold_in(key, 0)))
    loss, grads = jax.value_and_grad(mean_loss)(params, batch, key)
    return loss, layer_norms(grads)

  records = []
  for seed in range(seeds):
    batch = setup.data(data_dir, seed).train_batch(0)  # the first batch of this seed's stream
    loss, norms = init_and_probe(seed, batch)
    records.append(
        {
            "task": task,
            "placement": placement,
            "depth": depth,
            "seed": seed,
            "d_model": setup.model_cfg.d_model,
            "init_std": setup.model_cfg.init_std,
            "init": setup.model_cfg.init,
            "loss": round(float(loss), 5),
            "grad_norm": {
                stack: {g: [float(f"{v:.5g}") for v in vals.tolist()] for g, vals in groups.items()}
                for stack, groups in jax.device_get(norms).items()
            },
        }
    )
  return records


# ----------------------------------------------------------------------------- report
def stacks_of(records):
  return sorted({(r["task"], s) for r in records for s in r["grad_norm"]}, reverse=False)


def select(records, task, stack, placement, depth):
  return [
      r["grad_norm"][stack]["ffn"]
      for r in records
      if r["task"] == task and r["placement"] == placement and r["depth"] == depth
  ]


def depth_exponent(depths, values) -> float:
  """Least-squares slope of log(value) on log(depth)."""
  xs, ys = [math.log(d) for d in depths], [math.log(v) for v in values]
  mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
  return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def write_table(records, out: pathlib.Path) -> None:
  depths = sorted({r["depth"] for r in records})
  placements = [p for p in PLACEMENT_COLORS if any(r["placement"] == p for r in records)]
  head = " | ".join(f"L={d}: last (min-max), last/first" for d in depths)
  rows = [
      f"| task | stack | placement | {head} | exponent a (last ~ L^a) |",
      "|---|---|---|" + "---|" * len(depths) + "---|",
  ]
  for task, stack in stacks_of(records):
    for p in placements:
      cells, lasts = [], []
      for d in depths:
        runs = select(records, task, stack, p, d)
        if not runs:
          cells.append("-")
          continue
        last = [run[-1] for run in runs]
        mean = sum(last) / len(last)
        if any(run[0] == 0 for run in runs):  # a branch gated shut at init (ReZero's alpha = 0)
          ratio = "-"
        else:
          ratio = f"{sum(run[-1] / run[0] for run in runs) / len(runs):.2g}"
        if mean > 0:
          lasts.append((d, mean))
        cells.append(f"{mean:.3g} ({min(last):.3g}-{max(last):.3g}), {ratio}")
      slope = f"{depth_exponent(*zip(*lasts)):+.2f}" if len(lasts) > 1 else "-"
      rows.append(f"| {task} | {stack} | {p} | " + " | ".join(cells) + f" | {slope} |")
  seeds = len({r["seed"] for r in records})
  models = ", ".join(
      sorted(
          {
              f"{r['task']}: d_model {r['d_model']}, init {r.get('init', 'gpt2')}, "
              f"std {r.get('init_std', 0.02):g}"
              for r in records
          }
      )
  )
  text = (
      "# Gradient norm of the feed-forward weights at initialisation\n\n"
      + "\n".join(rows)
      + "\n\n`last` = L2 norm of the gradient of the last block's feed-forward kernels (wi, wo) "
      "of the mean token loss on one training batch at initialisation, seed mean (min-max over "
      f"{seeds} seeds); `last/first` = its ratio to the first block's, seed mean; exponent a = "
      "least-squares slope of log(last) against log(depth). Xiong et al. 2020 predict a = 0 "
      "for post-norm (the last block's gradient does not shrink with depth) and a = -1/2 for "
      "pre-norm, and post-norm's gradient growing towards the output (last/first > 1). A "
      "gradient of 0 is a branch whose output is multiplied by a gain that starts at 0 (ReZero): "
      "its ratio is '-', and it is left out of the exponent. "
      f"Models ({models}): the sweeps' own, layers scanned, dropout off.\n"
  )
  (out / "table.md").write_text(text)


def plot(records, out: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  depths = sorted({r["depth"] for r in records})
  stacks = stacks_of(records)
  fig, axes = plt.subplots(
      len(stacks), len(depths), figsize=(3.6 * len(depths), 2.9 * len(stacks)), squeeze=False
  )
  for row, (task, stack) in enumerate(stacks):
    for col, d in enumerate(depths):
      ax = axes[row][col]
      for p, color in PLACEMENT_COLORS.items():
        runs = select(records, task, stack, p, d)
        if not runs:
          continue
        layers = list(range(1, len(runs[0]) + 1))
        mean = [sum(r[i] for r in runs) / len(runs) for i in range(len(layers))]
        ax.plot(layers, mean, "-", marker="o", ms=2, color=color, label=p)
        lo = [min(r[i] for r in runs) for i in range(len(layers))]
        hi = [max(r[i] for r in runs) for i in range(len(layers))]
        ax.fill_between(layers, lo, hi, color=color, alpha=0.15)
      ax.set_yscale("log")
      ax.set_title(f"{task} {stack}, L={d}", fontsize=9)
      ax.set_xlabel("layer index")
      if col == 0:
        ax.set_ylabel("|grad W_FFN| at init")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "grad_vs_layer.png", dpi=100)
  plt.close(fig)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out:
    raise UserError("--out is required, e.g. --out experiments/results/deep_postnorm/grad_at_init")
  depths = []
  for d in FLAGS.depths:
    if not d.isdigit() or int(d) < 1:
      raise UserError(f"--depths {','.join(FLAGS.depths)}: give positive integers, e.g. 6,12")
    depths.append(int(d))
  if FLAGS.placements == ["all"]:
    FLAGS.placements = list(PLACEMENT_COLORS)
  bad = [p for p in FLAGS.placements if p not in PLACEMENT_COLORS]
  if bad:
    raise UserError(
        f"--placements: {bad[0]!r} is not one of {', '.join(PLACEMENT_COLORS)} (or all)"
    )
  bad = [t for t in FLAGS.tasks if t not in ("lm", "translation")]
  if bad:
    raise UserError(f"--tasks: {bad[0]!r} is not one of lm, translation")
  if FLAGS.init_std < 0:
    raise UserError(f"--init_std {FLAGS.init_std}: give 0 (the sweeps') or a positive std")
  if FLAGS.seeds < 1:
    raise UserError(f"--seeds {FLAGS.seeds}: give at least 1")
  from absl import logging

  logging.set_verbosity(logging.WARNING)
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  path = out / "grad_norms.jsonl"
  if not FLAGS.report_only:
    t0 = time.perf_counter()
    with open(path, "w") as f:
      for task in FLAGS.tasks:
        for p in FLAGS.placements:
          for d in depths:
            args = (FLAGS.seeds, FLAGS.d_model, FLAGS.batch_size, out / "data" / task)
            for r in probe(task, p, d, *args, init_std=FLAGS.init_std, init=FLAGS.init):
              f.write(json.dumps(r) + "\n")
            f.flush()
            print(f"{task} {p} L={d}: {time.perf_counter() - t0:.0f} s so far", flush=True)
    import shutil

    shutil.rmtree(out / "data", ignore_errors=True)
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  write_table(records, out)
  plot(records, out)
  print(f"wrote {out}/grad_norms.jsonl, table.md, grad_vs_layer.png", flush=True)
  return 0


if __name__ == "__main__":
  cli.run_script(main)
