"""Output change under a small weight perturbation, by norm placement and depth (no training).

    python scripts/amplification.py --out experiments/results/norm_zoo/amplification \
        [--placements post,admin,pre,deepnorm] [--depths 6,12,24,48] [--seeds 3] \
        [--epsilon 0.01] [--init_stds 0,0.25]

Liu et al. 2020 ("Understanding the Difficulty of Training Transformers", the Admin paper) trace
post-LN's instability to amplification: each block leans heavily on its residual branch, so a
small change of the weights moves the output by an amount that grows with depth N (O(N) for
post-LN, O(log N) for pre-LN and for Admin, whose profiled omega weights the skip connection).
They measure |F(x, W) - F(x, W*)| for a perturbed W* = W + delta. Here, for every placement,
depth and seed, the model of the LM sweeps (experiments/deep_postnorm.py: byte-level decoder,
d_model 16, 2 heads) is initialised as training initialises it (Admin's omega from its
profiling pass), every kernel of its blocks gets Gaussian noise of `epsilon` times that
kernel's own RMS, and the script reports the relative output change

    ||F(x, W*) - F(x, W)|| / ||F(x, W)||     (F = the logits, x = 8 rows of 32 random bytes)

It writes amplification.jsonl (one line per placement, depth and seed) and table.md: the seed
mean per depth, the ratio of the deepest to the shallowest, and the exponent a of a fit
change ~ N^a. Layers are scanned, so each (placement, depth) compiles once. A few CPU-minutes
for three placements at four depths on a 2-core machine.
"""

from __future__ import annotations

import json
import math
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps
from transformers_jax.modules.placements import PLACEMENTS

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_list("depths", ["6", "12", "24", "48"], "Blocks in the stack.", flag_values=FLAGS)
flags.DEFINE_list(
    "placements",
    ["post", "admin", "pre", "deepnorm"],
    "model.norm_placement values, or all (every built placement).",
    flag_values=FLAGS,
)
flags.DEFINE_integer("seeds", 3, "Seeds 0..N-1 (initialisation, noise, input).", flag_values=FLAGS)
flags.DEFINE_float(
    "epsilon", 0.01, "Noise RMS as a fraction of each kernel's RMS.", flag_values=FLAGS
)
flags.DEFINE_list(
    "init_stds",
    ["0", "0.25"],
    "model.init_std values (0 = the sweeps' 0.02). Admin's analysis assumes branch outputs as "
    "large as their inputs, as with Xavier initialisation: about 1/sqrt(d_model) = 0.25 here.",
    flag_values=FLAGS,
)
flags.DEFINE_bool("report_only", False, "Rewrite table.md from the jsonl.", flag_values=FLAGS)

SWEEP = "experiments/deep_postnorm.py"  # the model: the LM sweeps' tiny decoder
ROWS, LENGTH = 8, 32


def model_config(placement: str, depth: int, init_std: float):
  sweep = sweeps.load_sweep(sweeps.ROOT / SWEEP, ("BASE", "COMMON", "populations"))
  config = sweeps.base_config(sweep)
  config.update_from_flattened_dict(
      {
          **{k: v for k, v in sweep.COMMON.items() if k.startswith("model.")},
          "model.norm_placement": placement,
          "model.num_layers": depth,
          "model.scan_layers": True,
          "model.dropout": 0.0,
          **({"model.init_std": init_std} if init_std else {}),
      }
  )
  return config.model


def change_fn(placement: str, depth: int, init_std: float):
  """The jitted (seed, epsilon) -> relative logit change of this placement and depth: one
  compilation for every seed and noise level."""
  import jax
  import jax.numpy as jnp
  from flax import linen as nn

  from transformers_jax import models

  cfg = models.as_model_config(model_config(placement, depth, init_std))
  model = models.build_model(cfg)
  init = models.initializer(cfg)

  def perturb(params, key, epsilon):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(key, len(leaves))
    out = []
    for (path, w), k in zip(leaves, keys):
      names = [str(getattr(p, "key", p)) for p in path]
      if names[-1] == "kernel" and "layers" in names:  # the blocks' weights W
        rms = jnp.sqrt(jnp.mean(jnp.square(w)))
        w = w + epsilon * rms * jax.random.normal(k, w.shape, w.dtype)
      out.append(w)
    return jax.tree_util.tree_unflatten(treedef, out)

  @jax.jit
  def change(seed, epsilon):
    key = jax.random.PRNGKey(seed)
    params = nn.unbox(init(jax.random.fold_in(key, 0)))
    tokens = jax.random.randint(jax.random.fold_in(key, 1), (ROWS, LENGTH), 0, cfg.vocab_size)
    perturbed = perturb(params, jax.random.fold_in(key, 2), epsilon)
    before = model.apply({"params": params}, tokens)["logits"]
    after = model.apply({"params": perturbed}, tokens)["logits"]
    return jnp.linalg.norm(after - before) / jnp.linalg.norm(before)

  return change, cfg.init_std


def measure(placement: str, depth: int, init_std: float, seeds: int, epsilon: float) -> list[dict]:
  """One record per seed: the relative logit change under the perturbation."""
  change, std = change_fn(placement, depth, init_std)
  return [
      {
          "placement": placement,
          "depth": depth,
          "init_std": std,
          "seed": seed,
          "epsilon": epsilon,
          "relative_change": float(change(seed, epsilon)),
      }
      for seed in range(seeds)
  ]


def fit_exponent(depths, values) -> float:
  """Least-squares slope of log(value) against log(depth)."""
  xs = [math.log(d) for d in depths]
  ys = [math.log(v) for v in values]
  mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
  return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def write_table(records: list[dict], out: pathlib.Path) -> None:
  rows = list(dict.fromkeys((r["placement"], r["init_std"]) for r in records))
  depths = sorted({r["depth"] for r in records})
  epsilon = records[0]["epsilon"]
  lines = [
      "# Output change under a weight perturbation, by depth (Admin's amplification)",
      "",
      "| placement | init std | "
      + " | ".join(f"N={d}" for d in depths)
      + " | deepest / shallowest | a |",
      "|---|---|" + "---|" * (len(depths) + 2),
  ]
  for p, std in rows:
    means = []
    for d in depths:
      xs = [
          r["relative_change"]
          for r in records
          if (r["placement"], r["init_std"], r["depth"]) == (p, std, d)
      ]
      means.append(sum(xs) / len(xs) if xs else float("nan"))
    cells = " | ".join(f"{m:.2e}" for m in means)
    lines.append(
        f"| {p} | {std:g} | {cells} | {means[-1] / means[0]:.2f} | "
        f"{fit_exponent(depths, means):.2f} |"
    )
  lines += [
      "",
      f"Relative logit change ||F(x, W + delta) - F(x, W)|| / ||F(x, W)|| at initialisation, "
      f"delta Gaussian with {epsilon:g} x each block kernel's RMS; seed mean over "
      f"{len({r['seed'] for r in records})} seeds. a: exponent of a fit change ~ N^a. "
      "Init std: model.init_std, which placements with their own initialisation rule "
      "(deepnorm's and subln's Xavier gains, tfixup) do not use. "
      "Command: `python scripts/amplification.py` (see its docstring).",
  ]
  (out / "table.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out:
    raise UserError("--out is required, e.g. --out experiments/results/norm_zoo/amplification")
  placements = (
      [n for n, p in PLACEMENTS.items() if not p.unavailable]
      if FLAGS.placements == ["all"]
      else FLAGS.placements
  )
  unknown = [p for p in placements if p not in PLACEMENTS or PLACEMENTS[p].unavailable]
  if unknown:
    raise UserError(
        f"--placements {','.join(unknown)}: not a built placement; built: "
        + ", ".join(n for n, p in PLACEMENTS.items() if not p.unavailable)
    )
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  path = out / "amplification.jsonl"
  if not FLAGS.report_only:
    records = []
    for placement in placements:
      for init_std in map(float, FLAGS.init_stds):
        for depth in map(int, FLAGS.depths):
          records += measure(placement, depth, init_std, FLAGS.seeds, FLAGS.epsilon)
          mean = sum(r["relative_change"] for r in records[-FLAGS.seeds :]) / FLAGS.seeds
          print(f"{placement} init_std {init_std:g} N={depth}: change {mean:.5f}", flush=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
  records = [json.loads(line) for line in path.read_text().splitlines()]
  write_table(records, out)
  print(f"wrote {out}/amplification.jsonl, table.md", flush=True)
  return 0


if __name__ == "__main__":
  cli.run_script(main)
