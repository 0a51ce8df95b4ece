"""Compare training runs: a table of each run's final and best metrics, read from its
metrics.jsonl, and a plot of their loss curves (training loss solid, held-out loss dashed).

    python -m transformers_jax.compare runs/a runs/b [runs/pop:2 | runs/pop] [--plot curves.png]

RUN:I is member I of a population's run; a population's run given alone stands for every
member. Lines a resume wrote again (the steps after the checkpoint it resumed from) replace the
first ones, and a last line torn by a killed process is skipped; any other line that is not a
metrics line is refused. The plot goes to compare.png in the first run's folder unless --plot
names a file (a path without a suffix gets .png) or a folder (compare.png in it).
"""

from __future__ import annotations

import json
import math
import os
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

PLOT_NAME = "compare.png"  # the plot's name in a folder: the first run's, or one --plot names
flags.DEFINE_string(
    "plot",
    None,
    "Where to write the loss curves (PNG): a file, or a folder to write compare.png in; "
    "default: compare.png in the first run's folder; '' for none.",
)
FLAGS = flags.FLAGS

# the figures of the table when some run has them, and whether lower is better
FIGURES = dict(
    loss=True, eval_loss=True, eval_accuracy=False, eval_exact_match=False, eval_bleu=False
)
HPARAMS = ("seed", "learning_rate", "weight_decay", "warmup_steps", "z_loss")


def _records(folder: pathlib.Path) -> list[dict]:
  path = folder / "metrics.jsonl"
  if not folder.is_dir():
    raise UserError(f"{folder}: no such run folder: give the --workdir of a training run")
  if not path.is_file():
    raise UserError(
        f"{folder} has no metrics.jsonl: give the --workdir of a training run (it writes its "
        "first line after log_every steps)"
    )
  text = path.read_bytes().decode("utf-8", errors="replace")
  lines = text.splitlines()
  if lines and not text.endswith("\n"):
    lines.pop()  # a last line torn by a killed process (training cuts it before appending)
  rows = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError:
      row = None
    if not (isinstance(row, dict) and isinstance(row.get("step"), int)):
      raise UserError(
          f"{path} line {number} is not a metrics line ({line[:40]!r}): training writes one "
          "JSON object with its step a line; restore the file, or give another run"
      )
    rows.append(row)
  return rows


def run_folder(spec: str) -> tuple[pathlib.Path, int | None]:
  """(the run folder, the member or None) that `spec` (RUN or RUN:I) names."""
  folder = pathlib.Path(spec)
  head, _, tail = spec.rpartition(":")
  if head and tail.isdigit() and not folder.exists():
    return pathlib.Path(head), int(tail)
  return folder, None


def curves(spec: str) -> list[tuple[str, dict[str, dict[int, float]]]]:
  """[(label, {metric: {step: value}})] for the run, population or member `spec` names."""
  folder, member = run_folder(spec)
  rows = _records(folder)
  members = sorted({r["member"] for r in rows if isinstance(r.get("member"), int)})
  if member is not None and member not in members:
    held = f"members 0..{members[-1]}" if members else "one model, not a population"
    raise UserError(f"{spec}: {folder} holds {held}: give RUN:I with I among them, or RUN")
  picked = [member] if member is not None else members or [None]
  varying = [k for k in HPARAMS if len({r.get(k) for r in rows if "member" in r}) > 1]
  out = []
  for m in picked:
    metrics: dict[str, dict[int, float]] = {}
    mine = [r for r in rows if r.get("member") == m]
    for row in mine:
      for key, value in row.items():
        if key in FIGURES and isinstance(value, (int, float)):
          metrics.setdefault(key, {})[row["step"]] = float(value)
    label = spec if m is None or member is not None else f"{spec}:{m}"
    if m is not None and varying and mine:
      label += " (" + ", ".join(f"{k} {mine[0][k]:g}" for k in varying) + ")"
    out.append((label, metrics))
  return out


def _best(values: dict[int, float], lower: bool) -> tuple[int, float] | None:
  finite = [(s, v) for s, v in values.items() if math.isfinite(v)]
  if not finite:
    return None
  return min(finite, key=lambda sv: (sv[1] if lower else -sv[1], sv[0]))  # the first best


def table(runs: list[tuple[str, dict]]) -> str:
  """One row per run: its last step, then per figure its final value and its best one (lowest
  loss, highest accuracy) with the step it was reached at."""
  shown = [k for k in FIGURES if any(k in metrics for _, metrics in runs)]
  rows = [["run", "steps", *(f"{key}: final, best @step" for key in shown)]]
  for label, metrics in runs:
    steps = max((max(v) for v in metrics.values() if v), default=0)
    row = [label, str(steps)]
    for key in shown:
      values = metrics.get(key, {})
      best = _best(values, FIGURES[key])
      final = f"{values[max(values)]:.4f}" if values else "-"
      row.append(f"{final}, {best[1]:.4f} @{best[0]}" if best else final)
    rows.append(row)
  header = rows[0]
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
  return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def plot_path(flag: str | None, specs: list[str]) -> pathlib.Path | None:
  """Where --plot (`flag`; None: not given) has the plot written: compare.png in the first
  run's folder by default, in the folder --plot names, or the file it names (.png added to a
  name without a suffix, as matplotlib would); None for `--plot=`. A path that cannot be
  written is a UserError naming it and the reason."""
  if flag == "":
    return None
  if flag is None:
    path = run_folder(specs[0])[0] / PLOT_NAME
  else:
    path = pathlib.Path(flag).expanduser()
    if path.is_dir():
      path = path / PLOT_NAME
    elif not path.suffix:
      path = path.with_suffix(".png")
  if not path.resolve().parent.is_dir():
    raise UserError(f"--plot={path}: its folder does not exist: create it first")
  output_paths.check(path, "--plot", output_paths.FILE)
  return path


def plot(runs: list[tuple[str, dict]], path) -> None:
  """Loss against step, one colour per run: training loss solid, held-out loss dashed."""
  import matplotlib

  matplotlib.use("Agg")  # files only: no display needed
  from matplotlib import pyplot as plt

  figure, axes = plt.subplots(figsize=(8, 5))
  for i, (label, metrics) in enumerate(runs):
    colour = f"C{i % 10}"
    for key, style in (("loss", "-"), ("eval_loss", "--o")):
      points = sorted(metrics.get(key, {}).items())
      if points:
        name = label if key == "loss" else f"{label} (held-out)"
        axes.plot(*zip(*points), style, color=colour, label=name, markersize=3)
  axes.set_xlabel("step")
  axes.set_ylabel("loss")
  axes.grid(alpha=0.3)
  axes.legend(fontsize="small")
  figure.tight_layout()
  try:
    figure.savefig(path, dpi=120)
  except OSError as e:  # a full disk, a folder that changed since plot_path checked it
    raise UserError(f"--plot={path}: cannot write it ({e.strerror or e})") from None
  finally:
    plt.close(figure)


def main(argv):
  specs = argv[1:]
  if not specs:
    raise UserError("give one or more run folders: compare RUN_A RUN_B [RUN:MEMBER ...]")
  runs = [run for spec in specs for run in curves(spec)]
  path = plot_path(FLAGS.plot, specs)
  print(table(runs))
  if path is not None:
    plot(runs, path)
    print(f"loss curves: {path}")


if __name__ == "__main__":
  # compare never starts JAX: with JAX_PLATFORMS set, the command line's accelerator probe
  # (cli.quiet_cpu_host, which imports JAX: 3 CPU-seconds) is skipped
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  cli.run(main, start_backends=False)
