"""The deep post-norm study's tables and figures, from the sweeps' populations.jsonl files.

    python scripts/deep_postnorm_report.py --out experiments/results/deep_postnorm

Reads OUT/lm/populations.jsonl and OUT/translation/populations.jsonl (written by
scripts/lr_sensitivity.py with experiments/deep_postnorm.py and
experiments/deep_postnorm_translation.py) and writes

  table.md         per task, placement, depth and warmup: the best peak rate and its seed-mean
                   final loss with the min-max over seeds, the trainable range (the rates whose
                   seed-mean loss is within MARGIN nats of the configuration's best, and how many
                   of the grid's rates that is), every seed's own count of such rates, the LR
                   sensitivity (Wortsman et al. 2023) and the diverged members
  bleu.md          translation: greedy corpus BLEU and exact match per placement, depth, warmup
                   and rate, seed mean (min-max)
  loss_vs_lr.png   final held-out loss against peak rate per task and depth, one line per
                   placement and warmup, seed mean with a min-max band
  exact_match_vs_lr.png, bleu_vs_lr.png  translation exact match and BLEU against peak rate,
                   the same layout

A member's final loss is its last held-out evaluation loss; one that diverged or ends above the
initial loss ln(vocab) counts as the initial loss (as scripts/lr_sensitivity.py does).
"""

from __future__ import annotations

import json
import math
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string(
    "out", None, "The study's folder (holding lm/ and translation/).", flag_values=FLAGS
)
flags.DEFINE_integer(
    "at_step",
    0,
    "Also compare every LM run folder under --runs at this evaluation step (for populations "
    "stopped before their last step): writes table_step<N>.md, loss_vs_lr_step<N>.png and "
    "populations_step<N>.jsonl. 0 = off.",
    flag_values=FLAGS,
)
flags.DEFINE_list(
    "runs",
    [],
    "Population run folders (holding config.json and metrics.jsonl) for --at_step.",
    flag_values=FLAGS,
)
flags.DEFINE_float(
    "margin", 0.1, "Nats above the best seed-mean loss a trainable rate may be.", flag_values=FLAGS
)

TASKS = ("lm", "translation")
PLACEMENT_COLORS = {"pre": "tab:blue", "post": "tab:orange", "sandwich": "tab:green"}
WARMUP_STYLES = ("-", "--", ":")


def final_loss(member: dict, initial: float) -> float:
  loss = member.get("eval_loss")
  if member.get("diverged") or loss is None or not math.isfinite(loss) or loss > initial:
    return initial
  return loss


def by_warmup(record: dict, key: str = "loss") -> dict:
  """{warmup: {rate: [value per seed]}}: final loss (key "loss") or a member field (eval_bleu)."""
  initial = math.log(record["vocab_size"])
  out: dict = {}
  for m in record["members"]:
    value = final_loss(m, initial) if key == "loss" else m.get(key, 0.0)
    out.setdefault(m["warmup_steps"], {}).setdefault(m["learning_rate"], []).append(value)
  return out


def mean(values) -> float:
  return sum(values) / len(values)


def trainable_rates(by_lr: dict, margin: float) -> list[float]:
  """The rates whose seed-mean loss is within `margin` of the best seed-mean loss."""
  best = min(mean(v) for v in by_lr.values())
  return sorted(lr for lr, v in by_lr.items() if mean(v) <= best + margin)


def per_seed_trainable(by_lr: dict, margin: float) -> list[int]:
  """Per seed (members in seed order): how many rates come within `margin` of that seed's best."""
  seeds = len(next(iter(by_lr.values())))
  counts = []
  for s in range(seeds):
    losses = {lr: v[s] for lr, v in by_lr.items()}
    best = min(losses.values())
    counts.append(sum(loss <= best + margin for loss in losses.values()))
  return counts


def sensitivity(by_lr: dict, initial: float) -> float:
  means = [mean(v) for v in by_lr.values()]
  return sum(min(m, initial) - min(means) for m in means) / len(means)


def read(out: pathlib.Path) -> list[dict]:
  records = []
  for task in TASKS:
    path = out / task / "populations.jsonl"
    if path.exists():
      for line in path.read_text().splitlines():
        if line.strip():
          records.append({**json.loads(line), "task": task})
  return records


def record_at_step(workdir: pathlib.Path, step: int) -> dict:
  """A population's record (the populations.jsonl schema) from its run folder, every member's
  held-out loss and divergence taken at evaluation step `step`."""
  config = json.loads((workdir / "config.json").read_text())
  members: dict[int, dict] = {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    x = json.loads(line)
    if x["step"] > step:
      continue
    m = members.setdefault(
        x["member"], {k: x[k] for k in ("member", "seed", "learning_rate", "warmup_steps")}
    )
    if "loss" in x:
      m["diverged"] = x["diverged"]
    if "eval_loss" in x:
      m["eval_loss"], m["eval_step"] = x["eval_loss"], x["step"]
  reached = {m.get("eval_step") for m in members.values()}
  if reached != {step}:
    raise UserError(
        f"--at_step {step}: {workdir} has evaluations at steps up to {max(reached - {None}, default=0)}"
        " for some members; give a step every run folder reached"
    )
  model = config["model"]
  return {
      "name": workdir.name,
      "task": "lm",
      "placement": model["norm_placement"],
      "depth": model["num_layers"],
      "steps": step,
      "schedule_steps": config["steps"],
      "vocab_size": model["vocab_size"],
      "wall_s": 0.0,
      "members": [members[i] for i in sorted(members)],
  }


def write_table(
    records: list[dict],
    out: pathlib.Path,
    margin: float,
    name: str = "table.md",
    title: str = "final loss against peak learning rate, by placement and warmup",
    heading: str = "Deep post-norm",
) -> None:
  rows = [
      "| task | depth | placement | warmup | best LR | best loss (seed min-max) | trainable "
      f"rates (mean within {margin:g} of best) | count | per-seed counts | LR sensitivity | "
      "diverged |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in sorted(records, key=lambda r: (r["task"], r["depth"], r["placement"])):
    initial = math.log(r["vocab_size"])
    for warmup, by_lr in sorted(by_warmup(r).items()):
      best_lr = min(by_lr, key=lambda lr: mean(by_lr[lr]))
      band = by_lr[best_lr]
      rates = trainable_rates(by_lr, margin)
      diverged = sum(bool(m.get("diverged")) for m in r["members"] if m["warmup_steps"] == warmup)
      rows.append(
          f"| {r['task']} | {r['depth']} | {r['placement']} | "
          f"{warmup} of {r.get('schedule_steps', r['steps'])} | "
          f"{best_lr:g} | {mean(band):.3f} ({min(band):.3f}-{max(band):.3f}) | "
          f"{rates[0]:g}-{rates[-1]:g} | {len(rates)}/{len(by_lr)} | "
          f"{', '.join(str(c) for c in per_seed_trainable(by_lr, margin))} | "
          f"{sensitivity(by_lr, initial):.3f} | {diverged} |"
      )
  wall = sum(r["wall_s"] for r in records)
  text = (
      f"# {heading}: {title}\n\n"
      + "\n".join(rows)
      + "\n\nFinal loss = last held-out loss (nats per token); a diverged member, or one "
      "ending above ln(vocab), counts as ln(vocab). Trainable rates = the grid's rates whose "
      f"seed-mean final loss is within {margin:g} nats of the configuration's best; per-seed "
      "counts = the same count on each seed's own losses. LR sensitivity = mean over the grid "
      "of min(loss, ln vocab) - best (Wortsman et al. 2023).\n\n"
      f"{len(records)} populations, {sum(len(r['members']) for r in records)} members; "
      f"training wall time {wall / 60:.1f} min (sum over populations).\n"
  )
  (out / name).write_text(text)


def write_bleu(records: list[dict], out: pathlib.Path, heading: str = "Deep post-norm") -> None:
  runs = [r for r in records if r["task"] == "translation"]
  if not runs:
    return
  rates = sorted({m["learning_rate"] for r in runs for m in r["members"]})
  sections = []
  for key, title, fmt in (
      ("eval_bleu", "Corpus BLEU-4 (sacrebleu)", "{:.1f}"),
      ("eval_exact_match", "Exact match", "{:.2f}"),
  ):
    rows = [
        f"## {title}\n",
        "| depth | placement | warmup | " + " | ".join(f"LR {lr:g}" for lr in rates) + " |",
        "|---|---|---|" + "---|" * len(rates),
    ]
    for r in sorted(runs, key=lambda r: (r["depth"], r["placement"])):
      for warmup, by_lr in sorted(by_warmup(r, key).items()):
        cells = [
            (
                f"{fmt.format(mean(by_lr[lr]))} ({fmt.format(min(by_lr[lr]))}-"
                f"{fmt.format(max(by_lr[lr]))})"
            )
            if lr in by_lr
            else "-"
            for lr in rates
        ]
        rows.append(
            f"| {r['depth']}+{r['depth']} | {r['placement']} | {warmup} of {r['steps']} | "
            + " | ".join(cells)
            + " |"
        )
    sections.append("\n".join(rows))
  text = (
      f"# {heading}: translation BLEU and exact match against peak learning rate\n\n"
      + "\n\n".join(sections)
      + "\n\nEach member's greedy translations of the first held-out numbers "
      "(data.eval_translations of them) at the last step: corpus BLEU-4 (sacrebleu's default 13a tokenisation; 'twenty-one' is one word) "
      "and exact match (the fraction equal to the reference). Cells are seed means (min-max over "
      "seeds). BLEU-4 needs targets of four or more words: on numbers up to 999 most have one to "
      "three and BLEU reads 0 whatever the model does; up to 9,999, 7 in 10 held-out targets "
      "have four or five.\n"
  )
  (out / "bleu.md").write_text(text)


def plot(records: list[dict], out: pathlib.Path, key: str, name: str, ylabel: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = sorted(
      {(r["task"], r["depth"]) for r in records if key == "loss" or r["task"] == "translation"}
  )
  if not panels:
    return
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
  for r in records:
    if (r["task"], r["depth"]) not in panels:
      continue
    ax = axes[0][panels.index((r["task"], r["depth"]))]
    for k, (warmup, by_lr) in enumerate(sorted(by_warmup(r, key).items())):
      lrs = sorted(by_lr)
      color = PLACEMENT_COLORS[r["placement"]]
      ax.plot(
          lrs,
          [mean(by_lr[lr]) for lr in lrs],
          WARMUP_STYLES[k % len(WARMUP_STYLES)],
          color=color,
          marker="o",
          ms=3,
          label=f"{r['placement']}, warmup {warmup}",
      )
      ax.fill_between(
          lrs,
          [min(by_lr[lr]) for lr in lrs],
          [max(by_lr[lr]) for lr in lrs],
          color=color,
          alpha=0.1,
      )
    ax.set_xscale("log")
    depth = f"{r['depth']}+{r['depth']}" if r["task"] == "translation" else str(r["depth"])
    steps = r.get("schedule_steps", r["steps"])
    at = f"step {r['steps']} of {steps}" if steps != r["steps"] else f"{steps} steps"
    ax.set_title(f"{r['task']}, depth {depth}, {at}")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / name, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out:
    raise UserError("--out is required, e.g. --out experiments/results/deep_postnorm")
  out = pathlib.Path(FLAGS.out)
  records = read(out)
  if not records:
    raise UserError(
        f"--out {out}: no lm/populations.jsonl or translation/populations.jsonl there; run "
        "scripts/lr_sensitivity.py with the study's sweep files first"
    )
  write_table(records, out, FLAGS.margin)
  write_bleu(records, out)
  plot(records, out, "loss", "loss_vs_lr.png", "final held-out loss")
  plot(records, out, "eval_exact_match", "exact_match_vs_lr.png", "exact match (greedy)")
  plot(records, out, "eval_bleu", "bleu_vs_lr.png", "corpus BLEU-4 (greedy)")
  if FLAGS.at_step:
    step = FLAGS.at_step
    partial = [record_at_step(pathlib.Path(d), step) for d in FLAGS.runs]
    title = f"held-out loss at step {step} (the 'final loss' below), by placement and warmup"
    write_table(partial, out, FLAGS.margin, f"table_step{step}.md", title)
    plot(partial, out, "loss", f"loss_vs_lr_step{step}.png", f"held-out loss at step {step}")
    with open(out / f"populations_step{step}.jsonl", "w") as f:
      for r in partial:
        f.write(json.dumps(r) + "\n")
    print(f"wrote {out}/table_step{step}.md, loss_vs_lr_step{step}.png", flush=True)
  print(
      f"wrote {out}/table.md, bleu.md, loss_vs_lr.png, exact_match_vs_lr.png, bleu_vs_lr.png",
      flush=True,
  )
  return 0


if __name__ == "__main__":
  cli.run_script(main)
