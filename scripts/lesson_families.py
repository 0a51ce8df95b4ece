"""The lesson's families side by side: train each tiny preset on its bundled data, one line each.

    python scripts/lesson_families.py                   # all four, about two minutes on a CPU
    python scripts/lesson_families.py gpt2              # one family: gpt2 | bert | transformer | vit
    python scripts/lesson_families.py --steps 100 --workdir runs/families --out experiments/results/lesson

Each family trains with the project's `train()` and its preset's own training fields
(experiments/<file>.py TRAINING["tiny"]); the line gives the objective, the first and last
logged train loss, the held-out loss and accuracy, and the wall time (compilation included).
Without --workdir the runs go to a temporary folder that is deleted afterwards; --out writes
families.md, the same lines as a table.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import tempfile
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

ROOT = pathlib.Path(__file__).resolve().parent.parent

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(
    FLAGS, out=output_paths.FOLDER, workdir=output_paths.FOLDER
)  # checked before any work
flags.DEFINE_integer("steps", 0, "Train steps (0 = the preset's own).", flag_values=FLAGS)
flags.DEFINE_string(
    "workdir", "", "Keep the runs here (default: a temporary folder).", flag_values=FLAGS
)
flags.DEFINE_string("out", "", "Also write families.md to this folder.", flag_values=FLAGS)
FAMILIES = {  # file: (family, what it learns, what its accuracy counts)
    "gpt2": ("decoder-only", "next byte of Python source and pydoc text", "next-byte accuracy"),
    "bert": ("encoder-only", "masked bytes of the same text (15% chosen)", "masked-byte accuracy"),
    "transformer": (
        "encoder-decoder",
        "numbers: digits to English words",
        "next-token accuracy (teacher forcing)",
    ),
    "vit": ("ViT", "8x8 digit images, 10 classes", "image accuracy (chance 0.10)"),
}


def run_family(file: str, workdir: pathlib.Path, steps: int = 0) -> dict:
  from absl import logging
  from transformers_jax.models import counting
  from transformers_jax.config import load_config_module
  from transformers_jax.train.entry import train

  logging.set_verbosity(logging.WARNING)
  config = load_config_module(str(ROOT / "experiments" / f"{file}.py")).get_config("tiny")
  config.unlock()
  if steps:
    config.steps = steps
    config.eval_every = 0
    config.checkpoint_every = 0
  config.sample.max_new_tokens = 0
  workdir.mkdir(parents=True, exist_ok=True)
  t = time.perf_counter()
  with (
      open(workdir / "train.log", "a") as log,
      contextlib.redirect_stdout(log),
      contextlib.redirect_stderr(log),
  ):
    train(config, str(workdir))
  wall = time.perf_counter() - t
  rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = [r for r in rows if "loss" in r]
  final = [r for r in rows if "eval_loss" in r][-1]  # also when a finished run was rerun
  family, task, accuracy = FAMILIES[file]
  return {
      "file": file,
      "family": family,
      "task": task,
      "accuracy_of": accuracy,
      "params": counting.count(config.model),
      "steps": config.steps,
      "first_step": losses[0]["step"],
      "first_loss": losses[0]["loss"],
      "last_loss": losses[-1]["loss"],
      "eval_loss": final["eval_loss"],
      "eval_accuracy": final["eval_accuracy"],
      "wall_s": wall,
  }


def line(r: dict) -> str:
  return (
      f"{r['family']:<15} {r['file'] + '.py:tiny':<19} {r['params']:>8,} params  "
      f"{r['steps']:>3} steps  train loss {r['first_loss']:.2f} (step {r['first_step']}) -> "
      f"{r['last_loss']:.2f}  val loss {r['eval_loss']:.2f}  {r['accuracy_of']} "
      f"{r['eval_accuracy']:.3f}  {r['wall_s']:.0f}s  [{r['task']}]"
  )


def write_table(results: list[dict], path: pathlib.Path) -> None:
  lines = [
      "| family | preset | parameters | learns | steps | train loss (first → last) | "
      "val loss | val accuracy | wall time |",
      "|---|---|---:|---|---:|---|---:|---|---:|",
  ]
  for r in results:
    lines.append(
        f"| {r['family']} | {r['file']}.py:tiny | {r['params']:,} | {r['task']} | "
        f"{r['steps']} | {r['first_loss']:.2f} (step {r['first_step']}) → "
        f"{r['last_loss']:.2f} | {r['eval_loss']:.2f} | {r['eval_accuracy']:.3f} "
        f"({r['accuracy_of']}) | {r['wall_s']:.0f}s |"
    )
  path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
  """Positional arguments: families to train (default: all)."""
  names = cli.parse_script_flags(FLAGS, argv)
  files = names or list(FAMILIES)
  unknown = [f for f in files if f not in FAMILIES]
  if unknown:
    raise UserError(f"unknown family {unknown[0]!r}: choose from {', '.join(FAMILIES)}")
  results = []
  with contextlib.ExitStack() as stack:
    base = pathlib.Path(FLAGS.workdir or stack.enter_context(tempfile.TemporaryDirectory()))
    for file in files:
      workdir = base / file
      results.append(run_family(file, workdir, FLAGS.steps))
      print(line(results[-1]), flush=True)
  if FLAGS.out:
    out = pathlib.Path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    write_table(results, out / "families.md")


if __name__ == "__main__":
  cli.run_script(main)
