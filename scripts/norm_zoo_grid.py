"""Every norm placement on every family, looped and scanned: counts match and 5 steps train.

    python scripts/norm_zoo_grid.py --out experiments/results/norm_zoo/grid

The test suite checks each placement on every family's looped stack and on a scanned decoder
for its parameter count, and trains each placement for five steps on one (family, layout)
cell in turn (tests/test_norm_zoo.py), which keeps the suite small. This script runs the whole
cross product: every built placement of modules/placements/ x the four families x {looped,
scanned}. For each cell it checks that the analytic parameter count and its per-component
breakdown (models/counting.py) equal the model's own parameters, and trains 5 plain SGD steps
(rate 0.3) of a tiny model (2 blocks per stack, d_model 8) on a fixed random batch, asserting
a finite loss that falls. It writes

  grid.jsonl  one line per cell: counts, the 5 losses, and whether it passed
  grid.md     placements x (family, layout): the first and last loss, or what failed

and exits 1 when any cell fails. A few CPU-minutes on a 2-core CPU.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_list(
    "placements", [], "Placements to run (default: every built one).", flag_values=FLAGS
)
flags.DEFINE_integer("steps", 5, "SGD steps per cell.", flag_values=FLAGS)


def tiny_config(family: str, placement: str, scan: bool = False, **overrides):
  """A tiny model of `family` with `placement` (2 blocks per stack, d_model 8, vocabulary 16;
  a 4 x 4 one-channel image in 2 x 2 patches for the ViT), `overrides` on top (tests/ use it
  too)."""
  from transformers_jax.config import ModelConfig

  fields = dict(
      family=family,
      num_layers=2,
      d_model=8,
      num_heads=2,
      d_ff=16,
      max_len=8,
      vocab_size=16,
      norm_placement=placement,
      scan_layers=scan,
  )
  if family == "vit":
    fields.update(image_size=4, patch_size=2, num_classes=3, num_channels=1)
  if family == "encoder":
    fields.update(head="mlm")
  return ModelConfig(**{**fields, **overrides})


def loss_of(cfg):
  """The mean token (or image) cross-entropy of the model on a fixed random batch."""
  import jax
  import jax.numpy as jnp
  import optax

  from transformers_jax.models import build_model

  model = build_model(cfg)
  key = jax.random.PRNGKey(0)
  tokens = jax.random.randint(key, (2, 5), 0, cfg.vocab_size)
  images = jax.random.normal(key, (2, 4, 4, 1))

  def loss(params):
    variables = {"params": params}
    if cfg.family == "vit":
      logits, labels = model.apply(variables, images)["logits"], jnp.array([0, 1])
    elif cfg.family == "encoder_decoder":
      logits, labels = model.apply(variables, tokens, tokens[:, :-1])["logits"], tokens[:, 1:]
    elif cfg.family == "encoder":
      logits, labels = model.apply(variables, tokens)["logits"], tokens
    else:
      logits, labels = model.apply(variables, tokens[:, :-1])["logits"], tokens[:, 1:]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  return loss


def train_steps(cfg, steps: int, rate: float = 0.3) -> list[float]:
  """The losses of `steps` plain SGD steps from the model's init (tests/ use it too). A scanned
  stack starts from the same model's looped init, its blocks stacked: op by op, a looped init
  is cheaper than compiling one, and a scanned init compiles every nn.scan."""
  import jax
  from flax import linen as nn

  from transformers_jax.models import initializer
  from transformers_jax.modules.block import loop_to_scan

  params = nn.unbox(initializer(cfg.replace(scan_layers=False))(jax.random.PRNGKey(0)))
  params = loop_to_scan(params) if cfg.scan_layers else params
  loss_and_grads = jax.value_and_grad(loss_of(cfg))

  @jax.jit  # the update inside the one program: op by op it would compile per leaf shape
  def step(params):
    loss, grads = loss_and_grads(params)
    return loss, jax.tree_util.tree_map(lambda p, g: p - rate * g, params, grads)

  losses = []
  for _ in range(steps):
    loss, params = step(params)
    losses.append(float(loss))
  return losses


def run_cell(family: str, placement: str, scan: bool, steps: int) -> dict:
  import jax
  import numpy as np
  from flax import linen as nn

  from transformers_jax.models import counting, initializer

  cfg = tiny_config(family, placement, scan)
  shapes = nn.unbox(jax.eval_shape(initializer(cfg), jax.random.PRNGKey(0)))
  model_count = sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))
  counts_match = counting.analytic_count(cfg) == model_count and counting.tree_breakdown(
      shapes, cfg
  ) == counting.analytic_breakdown(cfg)
  losses = train_steps(cfg, steps)
  trains = bool(np.all(np.isfinite(losses))) and losses[-1] < losses[0]
  return {
      "placement": placement,
      "family": family,
      "layout": "scanned" if scan else "looped",
      "params": model_count,
      "counts_match": counts_match,
      "losses": losses,
      "passed": counts_match and trains,
  }


def write_table(cells: list[dict], out: pathlib.Path) -> None:
  columns = sorted({(c["family"], c["layout"]) for c in cells}, key=lambda fl: (fl[0], fl[1]))
  placements = list(dict.fromkeys(c["placement"] for c in cells))
  by_key = {(c["placement"], c["family"], c["layout"]): c for c in cells}
  lines = [
      "# Every placement x family x layout: counts and 5 training steps\n",
      "| placement | " + " | ".join(f"{f} {layout}" for f, layout in columns) + " |",
      "|---|" + "---|" * len(columns),
  ]
  for p in placements:
    row = []
    for f, layout in columns:
      c = by_key.get((p, f, layout))
      if c is None:
        row.append("-")
      elif c["passed"]:
        row.append(f"{c['losses'][0]:.2f} → {c['losses'][-1]:.2f}")
      else:
        row.append("**counts differ**" if not c["counts_match"] else "**does not train**")
    lines.append(f"| {p} | " + " | ".join(row) + " |")
  passed = sum(c["passed"] for c in cells)
  lines.append(
      f"\n{passed} of {len(cells)} cells pass: the analytic count and breakdown equal the "
      "model's parameters, and the loss (first → last of the steps) is finite and falls."
  )
  (out / "grid.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out:
    raise UserError("--out is required, e.g. --out experiments/results/norm_zoo/grid")
  from transformers_jax.config import FAMILIES
  from transformers_jax.modules.placements import PLACEMENTS

  built = [name for name, p in PLACEMENTS.items() if not p.unavailable]
  unknown = sorted(set(FLAGS.placements) - set(built))
  if unknown:
    raise UserError(f"--placements: {', '.join(unknown)} not built; built: {', '.join(built)}")
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  start, cells = time.time(), []
  for placement in FLAGS.placements or built:
    for family in FAMILIES:
      for scan in (False, True):
        cells.append(run_cell(family, placement, scan, FLAGS.steps))
        c = cells[-1]
        print(
            f"{placement} {family} {c['layout']}: {'ok' if c['passed'] else 'FAILED'} "
            f"({time.time() - start:.0f} s so far)",
            flush=True,
        )
  (out / "grid.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
  write_table(cells, out)
  failed = [c for c in cells if not c["passed"]]
  print(f"wrote {out}/grid.jsonl, grid.md: {len(cells) - len(failed)} of {len(cells)} pass")
  return 1 if failed else 0


if __name__ == "__main__":
  cli.run_script(main)
