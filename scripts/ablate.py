"""Run a sweep (one training run per point) and write its table, plots and raw runs.

    python scripts/ablate.py --sweep experiments/norm_ablation.py \
        --out experiments/results/norm_ablation [--scale] [--max_points N] [--report_only]

Each point trains in this process with the project's `train()` in OUT/runs/<name> (checkpoints,
metrics.jsonl, train.log), sharing one token cache (OUT/data). A point is finished when its line
is in OUT/runs.jsonl: rerunning the command skips finished points, and a point that was
interrupted resumes from its last checkpoint. After every invocation OUT holds

  runs.jsonl        one line per finished point: its fields, losses, curves, residual RMS, time
  table.md          one row per run
  loss_curves.png   train loss against step; columns by depth, rows by warmup
  residual_rms.png  RMS of the residual stream after each block at the end of training

Definitions (stated in table.md too): "train loss" is the mean logged train loss over the last
10% of steps; "val loss" the final held-out evaluation; a run "diverged" if its loss became
non-finite (training stops there) or its final train loss is above its start, ln(vocab_size),
the loss of the uniform prediction an initialised model makes; "steps to target" is the first
logged step whose train loss is at or below the sweep's TARGET_LOSS.
"""

from __future__ import annotations

import contextlib
import json
import math
import pathlib
import shutil
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string(
    "sweep", None, "Sweep file, e.g. experiments/norm_ablation.py.", flag_values=FLAGS
)
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_bool("scale", False, "The larger sweep, for an accelerator.", flag_values=FLAGS)
flags.DEFINE_integer(
    "max_points",
    0,
    "Run at most this many unfinished points, then stop " "(0 = all).",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "report_only",
    False,
    "Rewrite the table and plots from runs.jsonl; train " "nothing.",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "keep_checkpoints",
    False,
    "Keep finished points' checkpoints (deleted by " "default).",
    flag_values=FLAGS,
)
PLACEMENT_COLORS = {
    "pre": "tab:blue",
    "post": "tab:orange",
    "sandwich": "tab:green",
    "none": "tab:purple",
    "pre (no residual)": "tab:red",
}
NORM_STYLES = {"layernorm": "-", "rmsnorm": "--"}


# ----------------------------------------------------------------------------- the sweep
def load_sweep(path):
  return sweeps.load_sweep(path, ("BASE", "TARGET_LOSS", "points"))


point_config = sweeps.entry_config  # BASE with the point's overrides, tokens cached in OUT/data


def describe(config) -> dict:
  """The fields the table and plots group by."""
  m = config.model
  placement = m.norm_placement if m.residual else f"{m.norm_placement} (no residual)"
  return {
      "placement": placement,
      "norm": m.norm,
      "depth": m.num_layers,
      "warmup": config.warmup_steps,
      "residual": m.residual,
  }


# ----------------------------------------------------------------------------- one run
def read_metrics(workdir: pathlib.Path) -> list[dict]:
  """metrics.jsonl lines; a resumed run may log a step twice, the later line wins."""
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  by_key = {}
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue  # a line cut short by a kill
    by_key[(row["step"], "eval_loss" in row)] = row
  return [by_key[k] for k in sorted(by_key)]


def summarize(
    curve,
    eval_curve,
    steps: int,
    start_loss: float,
    target: float,
    failure: tuple[float, int] | None,
) -> dict:
  """Final losses, divergence and steps-to-target from the logged [step, loss] curves."""
  tail = [loss for step, loss in curve if step > steps - max(1, steps // 10)]
  final = sum(tail) / len(tail) if tail and failure is None else None
  reached = next((step for step, loss in curve if loss <= target), None)
  if failure is not None:
    reason = f"loss {failure[0]} at step {failure[1]}"
  elif final is None or not math.isfinite(final):
    reason = "no finite train loss logged"
  elif final > start_loss:
    reason = f"final loss {final:.3f} above start {start_loss:.3f}"
  else:
    reason = ""
  return {
      "train_loss": final,
      "val_loss": eval_curve[-1][1] if eval_curve and failure is None else None,
      "diverged": bool(reason),
      "diverged_reason": reason,
      "steps_to_target": reached,
  }


def run_point(sweep, point: dict, out: pathlib.Path, keep_checkpoints: bool) -> dict:
  from transformers_jax.run_folder.checkpoints import Checkpoints
  from transformers_jax.train.events import TrainingDiverged
  from transformers_jax.train.entry import train

  config = point_config(sweep, point, out)
  workdir = out / "runs" / point["name"]
  workdir.mkdir(parents=True, exist_ok=True)
  ckpt_dir = workdir / "checkpoints"
  resumed_from = Checkpoints(ckpt_dir).latest_step() if ckpt_dir.exists() else None
  failure, result = None, {}
  t = time.perf_counter()
  with (
      open(workdir / "train.log", "a") as log,
      contextlib.redirect_stdout(log),
      contextlib.redirect_stderr(log),
  ):
    try:
      result = train(config, str(workdir))
    except TrainingDiverged as e:
      print(f"diverged: {e}")
      failure = (e.loss, e.step)
  wall = time.perf_counter() - t
  rows = read_metrics(workdir)
  curve = [[r["step"], r["loss"]] for r in rows if "loss" in r]
  eval_curve = [[r["step"], r["eval_loss"]] for r in rows if "eval_loss" in r]
  rms = result.get("residual_rms") or next(
      (r["residual_rms"] for r in reversed(rows) if "residual_rms" in r), {}
  )
  start = math.log(config.model.vocab_size)
  record = {
      "name": point["name"],
      **describe(config),
      "steps": config.steps,
      **summarize(curve, eval_curve, config.steps, start, sweep.TARGET_LOSS, failure),
      "target_loss": sweep.TARGET_LOSS,
      "start_loss": start,
      "wall_s": round(wall, 2),
      "resumed_from": resumed_from,
      "residual_rms": rms if failure is None else {},
      "curve": [[s, round(v, 4)] for s, v in curve],
      "eval_curve": [[s, round(v, 4)] for s, v in eval_curve],
      "overrides": point["overrides"],
  }
  if not keep_checkpoints:
    shutil.rmtree(ckpt_dir, ignore_errors=True)
  return record


# ----------------------------------------------------------------------------- outputs
def _fmt(x, spec=".3f"):
  return "—" if x is None else format(x, spec)


def _clock(seconds: float) -> str:
  m, s = divmod(int(round(seconds)), 60)
  return f"{m}m{s:02d}s" if m else f"{s}s"


def write_table(runs: list[dict], path: pathlib.Path, target: float) -> None:
  lines = [
      "| run | placement | norm | depth | warmup | train loss | val loss | diverged | "
      f"steps to ≤ {target} | wall time |",
      "|---|---|---|---:|---:|---:|---:|---|---:|---:|",
  ]
  for r in runs:
    div = f"yes: {r['diverged_reason']}" if r["diverged"] else "no"
    reach = "not reached" if r["steps_to_target"] is None else str(r["steps_to_target"])
    wall = _clock(r["wall_s"]) + ("*" if r.get("resumed_from") else "")
    lines.append(
        f"| {r['name']} | {r['placement']} | {r['norm']} | {r['depth']} | "
        f"{r['warmup']} | {_fmt(r['train_loss'])} | {_fmt(r['val_loss'])} | {div} | "
        f"{reach} | {wall} |"
    )
  steps = sorted({r["steps"] for r in runs})
  lines += [
      "",
      f"{len(runs)} runs of {', '.join(map(str, steps))} steps; total wall time "
      f"{_clock(sum(r['wall_s'] for r in runs))}. train loss: mean logged train loss over the "
      "last 10% of steps; val loss: final held-out evaluation (nats per token). diverged: "
      "non-finite loss, or final train loss above ln(vocab), the untrained model's loss. "
      f"steps to ≤ {target}: first logged step with train loss ≤ {target}. "
      "Wall time includes compilation (* = resumed; time of the finishing invocation only).",
  ]
  path.write_text("\n".join(lines) + "\n")


def _grid(runs):
  depths = sorted({r["depth"] for r in runs})
  warmups = sorted({r["warmup"] for r in runs})
  return depths, warmups


def save_png(fig, path: pathlib.Path) -> None:
  """A small PNG: 80 dpi, quantised to a 64-colour palette (line plots need no more)."""
  import io
  from PIL import Image

  buf = io.BytesIO()
  fig.savefig(buf, dpi=80, format="png")
  buf.seek(0)
  Image.open(buf).convert("RGB").quantize(64).save(path, optimize=True)


def plot_curves(runs: list[dict], path: pathlib.Path, target: float) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  depths, warmups = _grid(runs)
  fig, axes = plt.subplots(
      len(warmups),
      len(depths),
      figsize=(4.2 * len(depths), 3.2 * len(warmups)),
      sharex=True,
      sharey=True,
      squeeze=False,
  )
  finite = [v for r in runs for _, v in r["curve"] if math.isfinite(v)]
  low = min(finite, default=0.0)
  high = max(min(max(r["start_loss"] for r in runs), low + 2.0), target + 0.2)  # the tail matters
  for i, w in enumerate(warmups):
    for j, d in enumerate(depths):
      ax = axes[i][j]
      for r in runs:
        if r["depth"] != d or r["warmup"] != w or not r["curve"]:
          continue
        steps, losses = zip(*r["curve"])
        (line,) = ax.plot(
            steps,
            losses,
            NORM_STYLES.get(r["norm"], ":"),
            lw=1.2,
            color=PLACEMENT_COLORS.get(r["placement"], "black"),
            label=f"{r['placement']}, {r['norm']}",
        )
        if r["diverged"]:
          ax.plot(steps[-1], losses[-1], "x", color=line.get_color(), ms=9, mew=2)
      ax.axhline(target, color="grey", lw=0.6, ls=":")
      ax.set_title(f"depth {d}, warmup {w}", fontsize=10)
      ax.set_ylim(low - 0.05, high + 0.1)
      ax.grid(alpha=0.3)
      if i == len(warmups) - 1:
        ax.set_xlabel("step")
      if j == 0:
        ax.set_ylabel("train loss")
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper right")
  fig.suptitle(
      f"train loss (logged batches) by depth; y axis cut at {high:.1f}; dotted: target "
      f"{target}; x: diverged",
      fontsize=11,
  )
  fig.tight_layout()
  save_png(fig, path)
  plt.close(fig)


def plot_rms(runs: list[dict], path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib import cm, ticker

  depths, warmups = _grid(runs)
  placements = list(dict.fromkeys(r["placement"] for r in runs))
  colors = {d: cm.viridis(k / max(1, len(depths) - 1) * 0.85) for k, d in enumerate(depths)}
  fig, axes = plt.subplots(
      len(warmups),
      len(placements),
      figsize=(3.6 * len(placements), 3.0 * len(warmups)),
      sharey=True,
      squeeze=False,
  )
  for i, w in enumerate(warmups):
    for j, p in enumerate(placements):
      ax = axes[i][j]
      here = [r for r in runs if r["placement"] == p and r["warmup"] == w]
      for r in here:
        for values in r["residual_rms"].values():
          ax.plot(
              range(1, len(values) + 1),
              values,
              NORM_STYLES.get(r["norm"], ":"),
              marker=".",
              color=colors[r["depth"]],
              label=f"depth {r['depth']}, {r['norm']}",
          )
      ax.set_yscale("log")
      ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
      ax.yaxis.set_minor_formatter(ticker.FormatStrFormatter("%g"))
      ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
      ax.set_title(f"{p}, warmup {w}", fontsize=10)
      ax.grid(alpha=0.3, which="both")
      if i == len(warmups) - 1:
        ax.set_xlabel("block")
      if j == 0:
        ax.set_ylabel("residual stream RMS")
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
      else:
        ax.text(
            0.5,
            0.5,
            "diverged: no RMS" if here else "not run",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
  fig.suptitle(
      "RMS of the residual stream after each block, end of training (held-out batch)", fontsize=11
  )
  fig.tight_layout()
  save_png(fig, path)
  plt.close(fig)


def write_outputs(sweep, points: list[dict], out: pathlib.Path) -> list[dict]:
  done = sweeps.read_records(out / "runs.jsonl")
  runs = [done[p["name"]] for p in points if p["name"] in done]
  if runs:
    write_table(runs, out / "table.md", sweep.TARGET_LOSS)
    plot_curves(runs, out / "loss_curves.png", sweep.TARGET_LOSS)
    plot_rms(runs, out / "residual_rms.png")
  return runs


# ----------------------------------------------------------------------------- the command
def _work(point) -> float:
  """Relative cost of a point, for the time estimate: steps x (blocks + embedding/head)."""
  o = point["overrides"]
  return o.get("steps", 1) * (o.get("model.num_layers", 2) + 2)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.sweep or not FLAGS.out:
    raise UserError(
        "--sweep and --out are required, e.g. --sweep "
        "experiments/norm_ablation.py --out experiments/results/norm_ablation"
    )
  from absl import logging

  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  sweep = load_sweep(FLAGS.sweep)
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  points = sweep.points(FLAGS.scale)
  sweeps.check_entries(sweep, points, "point", "max_points", FLAGS.max_points)
  for p in points:  # every point's config is checked before anything trains
    point_config(sweep, p, out)
  done = sweeps.read_records(out / "runs.jsonl")
  todo = [p for p in points if p["name"] not in done]
  if FLAGS.max_points:
    todo = todo[: FLAGS.max_points]
  finished = sum(p["name"] in done for p in points)
  print(
      f"{len(points)} points: {finished} finished, {0 if FLAGS.report_only else len(todo)} to "
      f"run now; results in {out}",
      flush=True,
  )
  total_work = sum(_work(p) for p in todo)
  work_done, t0 = 0.0, time.perf_counter()
  try:
    for k, p in enumerate([] if FLAGS.report_only else todo, start=1):
      record = run_point(sweep, p, out, FLAGS.keep_checkpoints)
      sweeps.append_record(out / "runs.jsonl", record)
      work_done += _work(p)
      elapsed = time.perf_counter() - t0
      left = elapsed / work_done * (total_work - work_done)
      status = (
          "DIVERGED " + record["diverged_reason"]
          if record["diverged"]
          else f"train {_fmt(record['train_loss'])} val {_fmt(record['val_loss'])}"
      )
      resumed = f", resumed from step {record['resumed_from']}" if record["resumed_from"] else ""
      print(
          f"[{finished + k}/{len(points)}] {p['name']}: {status} in {_clock(record['wall_s'])}"
          f"{resumed} | elapsed {_clock(elapsed)}, ~{_clock(left)} left",
          flush=True,
      )
  finally:
    runs = write_outputs(sweep, points, out)
  print(
      f"wrote {len(runs)} runs: table.md, loss_curves.png, residual_rms.png, runs.jsonl "
      f"({_clock(time.perf_counter() - t0)})",
      flush=True,
  )
  return 0


if __name__ == "__main__":
  cli.run_script(main)
