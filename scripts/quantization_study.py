"""Quantized training against float on the same batches: a preset (`--preset`, by default
`gpt2.py:tiny`) for 300 steps as one population of 3 seeds per (norm placement, quantization mode), so member i of every population
trains on seed i's batches; the final held-out loss per member and each population's mean with
its seed band (min to max), and the train-loss curves.

    python scripts/quantization_study.py --out experiments/results/quantization
    python scripts/quantization_study.py --placements pre,post,sandwich,deepnorm \\
        --modes ,int8 --out experiments/results/quantization --name placements
    python scripts/quantization_study.py --preset bert.py:tiny --name bert \
        --out experiments/results/quantization   # likewise transformer.py:tiny, vit.py:tiny

Writes OUT/NAME.json (every member's final held-out loss and logged train losses, each
population's command and seconds), OUT/NAME.png (train loss against step: each population's
mean over its seeds, its band shaded, one panel per placement) and prints a markdown table
(mean, band, ratio to float). `--plot_only` redraws the figure and table from NAME.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
flags.DEFINE_string(
    "preset", "gpt2.py:tiny", "The experiments/ preset every population trains.", flag_values=FLAGS
)
flags.DEFINE_string("placements", "pre", "Comma-separated norm placements.", flag_values=FLAGS)
flags.DEFINE_string(
    "modes", ",int8,fp8", "Comma-separated quantization modes ('' = float32).", flag_values=FLAGS
)
flags.DEFINE_integer("steps", 300, "Training steps of every population.", flag_values=FLAGS)
flags.DEFINE_integer("seeds", 3, "Members (seeds) per population.", flag_values=FLAGS)
flags.DEFINE_string("out", "experiments/results/quantization", "Output folder.", flag_values=FLAGS)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string("name", "modes", "Stem of the JSON and PNG written.", flag_values=FLAGS)
flags.DEFINE_bool(
    "plot_only", False, "Redraw NAME.png and the table from NAME.json.", flag_values=FLAGS
)

ROOT = Path(__file__).resolve().parent.parent


def train(workdir: Path, placement: str, mode: str, steps: int, seeds: int) -> tuple[list, float]:
  """One population; (its command's arguments, seconds)."""
  args = [
      f"--config=experiments/{FLAGS.preset}",
      f"--workdir={workdir}",
      f"--config.steps={steps}",
      f"--config.population.seeds={seeds}",
      f"--config.model.norm_placement={placement}",
      f"--config.model.quantization={mode}",
      "--config.eval_every=100",
      "--config.checkpoint_every=0",
      "--config.log_every=25",
  ]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  start = time.perf_counter()
  subprocess.run(
      [sys.executable, "-m", "transformers_jax.train", *args],
      cwd=ROOT,
      env=env,
      check=True,
      stdout=subprocess.DEVNULL,
  )
  return args[2:], time.perf_counter() - start


def read_metrics(workdir: Path, steps: int) -> dict:
  """{member: {"eval_loss": final held-out loss, "curve": [[step, train loss], ...]}}."""
  members: dict = {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    record = json.loads(line)
    member = members.setdefault(record["member"], {"curve": []})
    if "loss" in record:
      member["curve"].append([record["step"], record["loss"]])
    if "eval_loss" in record and record["step"] == steps:
      member["eval_loss"] = record["eval_loss"]
  return members


def plot(rows, path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  placements = list(dict.fromkeys(r["placement"] for r in rows))
  fig, axes = plt.subplots(1, len(placements), figsize=(4.5 * len(placements), 3.6), squeeze=False)
  for ax, placement in zip(axes[0], placements):
    for r in (r for r in rows if r["placement"] == placement):
      curves = list(r["curves"].values())
      steps = [s for s, _ in curves[0]]
      losses = np.array([[loss for _, loss in c] for c in curves])
      line = ax.plot(steps, losses.mean(0), label=r["mode"])[0]
      ax.fill_between(steps, losses.min(0), losses.max(0), color=line.get_color(), alpha=0.2)
    ax.set(
        title=f"{placement}-LN, gpt2.py:tiny", xlabel="step", ylabel="train loss", ylim=(2.2, 3.6)
    )
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def table(rows) -> None:
  """The markdown table the results README quotes: each population's mean held-out loss, its
  seed band, its ratio to the same placement's float32 mean and its per-seed difference from
  float32's run on the same seed."""
  floats = {r["placement"]: r for r in rows if r["mode"] == "float32"}
  print("| placement | mode | held-out loss (mean) | seed band | / float32 | − float32 per seed |"
        " wall s |")  # fmt: skip
  print("|---|---|---:|---|---:|---|---:|")
  for r in rows:
    base = floats.get(r["placement"])
    ratio = r["mean"] / base["mean"] if base else float("nan")
    band = f"{r['band'][0]:.4f} – {r['band'][1]:.4f}"
    diffs = "—"
    if base and r is not base:
      diffs = ", ".join(f"{a - b:+.4f}" for a, b in zip(r["eval_loss"], base["eval_loss"]))
    print(
        f"| {r['placement']} | {r['mode']} | {r['mean']:.4f} | {band} | {ratio:.4f} | {diffs} | "
        f"{r['seconds']:.0f} |"
    )


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  a = FLAGS
  if a.plot_only:
    rows = json.loads((Path(a.out) / f"{a.name}.json").read_text())
    plot(rows, Path(a.out) / f"{a.name}.png")
    return table(rows)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for placement in a.placements.split(","):
      for mode in a.modes.split(","):
        workdir = Path(tmp) / f"{placement}_{mode or 'float32'}"
        args, seconds = train(workdir, placement, mode, a.steps, a.seeds)
        members = read_metrics(workdir, a.steps)
        losses = [members[m]["eval_loss"] for m in sorted(members)]
        rows.append(
            dict(
                placement=placement,
                mode=mode or "float32",
                eval_loss=losses,
                mean=sum(losses) / len(losses),
                band=[min(losses), max(losses)],
                curves={str(m): members[m]["curve"] for m in sorted(members)},
                seconds=round(seconds, 1),
                preset=FLAGS.preset,
                command=f"python -m transformers_jax.train --config=experiments/{FLAGS.preset} "
                + " ".join(x for x in args if not x.startswith("--workdir")),
            )
        )
        print(f"{placement} {mode or 'float32'}: {losses} ({seconds:.0f} s)", flush=True)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / f"{a.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
  plot(rows, out / f"{a.name}.png")
  table(rows)


if __name__ == "__main__":
  cli.run_script(main)
