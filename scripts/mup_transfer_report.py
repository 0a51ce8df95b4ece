"""Read the μP transfer study's sweeps and write its table, JSON and plots.

    python scripts/mup_transfer_report.py --out experiments/results/mup

Each sweep (scripts/lr_sensitivity.py runs it into OUT/<study>) is one population per
(parametrisation, width or depth, placement) whose members are peak learning rates x seeds:

  width       experiments/mup_width.py       sp and mup at d_model 32..256, 2 blocks
  depth       experiments/mup_depth.py       mup and complete_p at 2..16 blocks
  placements  experiments/mup_placements.py  the width sweep under post-LN, sandwich, DeepNorm

A study whose OUT/<study>/populations.jsonl is missing is skipped. A member's loss is its last
held-out loss; one that diverged or ends above the initial loss ln(vocab) counts as ln(vocab).
Writes

  lr_transfer.json   a list of rows {study, parametrization, placement, width, depth, lr, loss
                     (the seed mean), seed_losses, population, population_cpu_s}
  transfer.md        per study, parametrisation and placement: the best rate's grid index at each
                     width (or depth) and how far it moves (max - min), with each population's
                     CPU seconds
  lr_transfer.png    loss against rate, one curve per width, one panel per parametrisation (and
                     per placement); lr_transfer_depth.png the same per depth
"""

from __future__ import annotations

import json
import math
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)
flags.DEFINE_string("out", None, "The study's folder (experiments/results/mup).", flag_values=FLAGS)

ROOT = pathlib.Path(__file__).resolve().parents[1]
STUDIES = {  # study -> (sweep file, what varies across its populations)
    "width": ("experiments/mup_width.py", "width"),
    "depth": ("experiments/mup_depth.py", "depth"),
    "placements": ("experiments/mup_placements.py", "width"),
}


def rows_of(study: str, folder: pathlib.Path) -> list[dict]:
  """lr_transfer.json's rows of one study's populations.jsonl."""
  sweep = sweeps.load_sweep(ROOT / STUDIES[study][0], ("BASE", "populations"))
  entries = {e["name"]: e["overrides"] for e in sweep.populations(False)}
  rows = []
  for record in sweeps.read_records(folder / "populations.jsonl").values():
    o = entries[record["name"]]
    initial = math.log(record["vocab_size"])
    by_lr: dict[float, list[float]] = {}
    for m in record["members"]:
      loss = m.get("eval_loss", math.inf)
      bad = m.get("diverged") or not math.isfinite(loss) or loss > initial
      by_lr.setdefault(m["learning_rate"], []).append(initial if bad else loss)
    for lr in sorted(by_lr):
      rows.append(
          {
              "study": study,
              "parametrization": o.get("model.parametrization", "sp"),
              "placement": o.get("model.norm_placement", "pre"),
              "width": o["model.d_model"],
              "depth": o["model.num_layers"],
              "lr": lr,
              "loss": round(sum(by_lr[lr]) / len(by_lr[lr]), 5),
              "seed_losses": by_lr[lr],
              "population": record["name"],
              "population_cpu_s": record["cpu_s"],
          }
      )
  return rows


def transfer(rows: list[dict], axis: str) -> dict:
  """{(parametrization, placement): {value of `axis`: (best rate's grid index, best rate, its
  loss)}} over a study's rows."""
  out: dict = {}
  for r in rows:
    out.setdefault((r["parametrization"], r["placement"]), {}).setdefault(r[axis], []).append(r)
  best = {}
  for key, by_value in out.items():
    best[key] = {}
    for value, rs in sorted(by_value.items()):
      rs = sorted(rs, key=lambda r: r["lr"])
      i = min(range(len(rs)), key=lambda j: rs[j]["loss"])
      best[key][value] = (i, rs[i]["lr"], rs[i]["loss"])
  return best


def table(rows: list[dict]) -> str:
  lines = []
  for study, (_, axis) in STUDIES.items():
    these = [r for r in rows if r["study"] == study]
    if not these:
      continue
    lines += [
        f"## {study}: best rate's grid index per {axis}",
        "",
        f"| parametrization | placement | {axis}: best index (rate, loss) | moves by | CPU s |",
        "|---|---|---|---|---|",
    ]
    for (p, placement), by_value in transfer(these, axis).items():
      cells = ", ".join(f"{v}: {i} ({lr:g}, {loss:.3f})" for v, (i, lr, loss) in by_value.items())
      indices = [i for i, _, _ in by_value.values()]
      cpu = sum(
          {
              r["population"]: r["population_cpu_s"]
              for r in these
              if (r["parametrization"], r["placement"]) == (p, placement)
          }.values()
      )
      lines.append(f"| {p} | {placement} | {cells} | {max(indices) - min(indices)} | {cpu:.0f} |")
    lines.append("")
  return "\n".join(lines)


def plot(rows: list[dict], axis: str, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = sorted({(r["placement"], r["parametrization"]) for r in rows})
  fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
  low = min(r["loss"] for r in rows)
  for ax, (placement, p) in zip(axes[0], panels):
    values = sorted(
        {r[axis] for r in rows if (r["placement"], r["parametrization"]) == (placement, p)}
    )
    for i, v in enumerate(values):
      rs = sorted(
          (r for r in rows if (r["placement"], r["parametrization"], r[axis]) == (placement, p, v)),
          key=lambda r: r["lr"],
      )
      color = plt.cm.viridis(i / max(len(values) - 1, 1))
      ax.plot(
          [r["lr"] for r in rs],
          [r["loss"] for r in rs],
          marker="o",
          ms=3,
          color=color,
          label=f"{axis} {v}",
      )
      best = min(rs, key=lambda r: r["loss"])
      ax.plot([best["lr"]], [best["loss"]], "*", ms=10, color=color)
    ax.set_xscale("log", base=2)
    ax.set_ylim(low - 0.05, low + 1.0)
    ax.set_title(f"{p}" + ("" if placement == "pre" else f", {placement}"), fontsize=10)
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final held-out loss (seed mean)")
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out:
    raise UserError("--out is required, e.g. --out experiments/results/mup")
  out = pathlib.Path(FLAGS.out)
  rows = []
  for study in STUDIES:
    if (out / study / "populations.jsonl").is_file():
      rows += rows_of(study, out / study)
  if not rows:
    raise UserError(f"--out={out}: no OUT/<study>/populations.jsonl yet: run the sweeps first")
  (out / "lr_transfer.json").write_text(json.dumps(rows, indent=0) + "\n")
  (out / "transfer.md").write_text(table(rows))
  width = [r for r in rows if r["study"] in ("width", "placements")]
  if width:
    plot(width, "width", out / "lr_transfer.png")
  depth = [r for r in rows if r["study"] == "depth"]
  if depth:
    plot(depth, "depth", out / "lr_transfer_depth.png")
  print(table(rows))
  return 0


if __name__ == "__main__":
  cli.run_script(main)
