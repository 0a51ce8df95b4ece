"""Run a learning-rate sensitivity sweep (one population per configuration) and report it.

    python scripts/lr_sensitivity.py --sweep experiments/lr_sensitivity.py \
        --out experiments/results/lr_sensitivity [--scale] [--max_populations N] [--only NAMES]
        [--report_only]

The one sweep runner (scripts/ablate.py, which trained one run per point, retired in its
favour; its norm ablation reruns here: --sweep experiments/norm_ablation.py): each
configuration of the sweep file is one population (transformers_jax/train/population.py) whose members are the learning
rates x warmups x seeds, trained in this process in OUT/runs/<name>. A configuration is finished
when its line is in OUT/populations.jsonl; rerunning skips finished ones (an interrupted one
resumes from its checkpoint). OUT then holds

  populations.jsonl   per configuration: every member's final losses, divergence, logit curves,
                      and the wall and CPU seconds the population took
  table.md            per configuration and warmup: LR sensitivity, best rate and loss, diverged
                      members, final attention logits
  loss_vs_lr.png      final held-out loss against learning rate, the seed mean with a min-max
                      band over seeds; one column per depth, one row per warmup
  attention_logits.png  the largest attention logit (over blocks) against step at the largest
                      learning rate, seed mean; one column per depth

Definitions (in table.md too): a member's "final loss" is its last held-out evaluation loss; a
member that diverged (non-finite loss) or ends above the initial loss ln(vocab) counts as the
initial loss. "LR sensitivity" (Wortsman et al. 2023) is the mean over the learning-rate grid of
min(loss(lr), initial loss) - min over lr of loss(lr), on seed-mean losses: 0 when every rate
reaches the best loss, large when only a narrow band of rates trains.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import sys
import time

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string(
    "sweep", None, "Sweep file, e.g. experiments/lr_sensitivity.py.", flag_values=FLAGS
)
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_bool("scale", False, "The larger sweep, for an accelerator.", flag_values=FLAGS)
flags.DEFINE_integer(
    "max_populations",
    0,
    "Run at most this many unfinished populations (0 = all).",
    flag_values=FLAGS,
)
flags.DEFINE_list(
    "only",
    [],
    "Run only these populations (names, comma-separated); several processes with different "
    "--only lists can share one --out.",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "keep_checkpoints",
    False,
    "Keep each population's last checkpoint in OUT/runs/NAME (for probes of the trained "
    "models, e.g. scripts/block_contribution.py); by default it is removed.",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "report_only", False, "Rewrite table and plots from populations.jsonl.", flag_values=FLAGS
)
PLACEMENT_COLORS = {"pre": "tab:blue", "post": "tab:orange", "sandwich": "tab:green"}


def scheme_label(placement: str, norm: str, residual: bool = True) -> str:
  """The placement, with the norm kind when it is not layernorm (the zoo's pre-dyt), and
  "(no residual)" for a stack without its residual connections (the norm ablation's)."""
  label = placement if norm == "layernorm" else f"{placement}-{norm}"
  return label if residual else f"{label} (no residual)"


def color_of(label: str) -> str:
  """pre/post/sandwich in their usual colours; every other scheme one of matplotlib's cycle,
  by its name (the same in every figure)."""
  if label in PLACEMENT_COLORS:
    return PLACEMENT_COLORS[label]
  return f"C{3 + sum(map(ord, label)) % 7}"


def load_sweep(path):
  return sweeps.load_sweep(path, ("BASE", "populations"))


def population_config(sweep, entry, out: pathlib.Path):
  """BASE with the entry's overrides (a misspelt field is an error), tokens cached in OUT/data."""
  return sweeps.entry_config(sweep, entry, out, kind="population")


def _work(sweep, entry, out: pathlib.Path) -> float:
  """A population's relative cost, for the time-left estimate: steps x members x blocks."""
  from transformers_jax.train import members

  config = population_config(sweep, entry, out)
  return config.steps * len(members.members(config)) * config.model.num_layers


def summarize(workdir: pathlib.Path, config) -> list[dict]:
  """Per member: hyperparameters, final train/eval loss, divergence, eval curves."""
  members: dict[int, dict] = {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    x = json.loads(line)
    m = members.setdefault(
        x["member"],
        {
            k: x[k]
            for k in ("member", "seed", "learning_rate", "warmup_steps", "weight_decay", "z_loss")
        },
    )
    if "loss" in x:
      m["train_loss"] = x["loss"]
      m["diverged"] = x["diverged"]
      if x["diverged"]:
        m["diverged_at"] = x["diverged_at"]
    if "eval_loss" in x:
      m["eval_loss"] = x["eval_loss"]
      m.setdefault("eval_losses", []).append(x["eval_loss"])
      rms = x.get("residual_rms", {}).get("decoder")
      if rms:  # the residual stream's RMS leaving each block, at the last evaluation
        m["residual_rms"] = rms
      for key in ("eval_bleu", "eval_exact_match", "eval_accuracy"):  # per-task metrics
        if key in x:
          m[key] = x[key]
      m.setdefault("eval_steps", []).append(x["step"])
      logits = x.get("attention_logit_max", {}).get("decoder", [])
      m.setdefault("attention_logit_max", []).append(max(logits) if logits else None)
      m.setdefault("attention_logit_max_per_layer", []).append(logits)
      m.setdefault("output_logit_max", []).append(x["eval_logit_max"])
      m.setdefault("output_logit_mean", []).append(x["eval_logit_mean"])
  return [_rounded(members[i]) for i in sorted(members)]


def _rounded(x):
  """Floats to 5 significant digits (the file stays small; losses differ in the 3rd decimal)."""
  if isinstance(x, float):
    return float(f"{x:.5g}")
  if isinstance(x, dict):
    return {k: _rounded(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_rounded(v) for v in x]
  return x


def run_population(sweep, entry, out: pathlib.Path) -> dict:
  from transformers_jax.train.entry import train

  config = population_config(sweep, entry, out)
  workdir = out / "runs" / entry["name"]
  wall, cpu = time.perf_counter(), time.process_time()
  train(config, workdir)
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  record = {
      "name": entry["name"],
      "placement": scheme_label(
          config.model.norm_placement, config.model.norm, config.model.residual
      ),
      "qk_norm": bool(config.model.qk_norm),
      "depth": config.model.num_layers,
      "steps": config.steps,
      "vocab_size": config.model.vocab_size,
      "wall_s": round(wall, 1),
      "cpu_s": round(cpu, 1),
      "members": summarize(workdir, config),
  }
  if not FLAGS.keep_checkpoints:
    shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
  return record


# ----------------------------------------------------------------------------- analysis
def capped(loss, initial):
  return initial if loss is None or not math.isfinite(loss) or loss > initial else loss


def curves(record) -> dict:
  """{warmup: {lr: [final loss per seed]}} with diverged members at the initial loss."""
  initial = math.log(record["vocab_size"])
  out: dict = {}
  for m in record["members"]:
    loss = capped(m.get("eval_loss"), initial) if not m.get("diverged") else initial
    out.setdefault(m["warmup_steps"], {}).setdefault(m["learning_rate"], []).append(loss)
  return out


def lr_sensitivity(by_lr: dict, initial: float) -> tuple[float, float, float]:
  """(sensitivity, best rate, best seed-mean loss)."""
  means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
  best_lr = min(means, key=means.get)
  best = means[best_lr]
  sens = sum(min(v, initial) - best for v in means.values()) / len(means)
  return sens, best_lr, best


def write_table(records, out: pathlib.Path) -> None:
  rows = [
      "| population | depth | placement | qk_norm | warmup | LR sensitivity | best LR | best loss "
      "| diverged members | attn logit max at the largest LR (end) |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in sorted(records, key=lambda r: (r["depth"], r["placement"], r["qk_norm"], r["name"])):
    initial = math.log(r["vocab_size"])
    for warmup, by_lr in sorted(curves(r).items()):
      sens, best_lr, best = lr_sensitivity(by_lr, initial)
      mem = [m for m in r["members"] if m["warmup_steps"] == warmup]
      diverged = sum(bool(m.get("diverged")) for m in mem)
      top = max(m["learning_rate"] for m in mem)
      logits = [
          m["attention_logit_max"][-1]
          for m in mem
          if m["learning_rate"] == top and m.get("attention_logit_max") and not m.get("diverged")
      ]
      logits = [x for x in logits if x is not None]  # a model without a decoder stack (ViT)
      logit = f"{sum(logits) / len(logits):.1f}" if logits else "-"
      rows.append(
          f"| {r['name']} | {r['depth']} | {r['placement']} | {'on' if r['qk_norm'] else 'off'} | "
          f"{warmup} | "
          f"{sens:.3f} | {best_lr:g} | {best:.3f} | {diverged}/{len(mem)} | {logit} |"
      )
  wall = sum(r["wall_s"] for r in records)
  cpu = sum(r["cpu_s"] for r in records)
  members = sum(len(r["members"]) for r in records)
  text = (
      "# LR sensitivity: norm placement x qk_norm x warmup x depth\n\n"
      + "\n".join(rows)
      + "\n\nFinal loss = last held-out evaluation loss (nats per byte); a diverged member, or "
      "one ending above the initial loss ln(vocab), counts as the initial loss. LR sensitivity "
      "= mean over the learning-rate grid of min(loss(lr), initial) - min_lr loss(lr), on the "
      "seed-mean loss (Wortsman et al. 2023). Attention logit = largest pre-softmax q.k/sqrt(d) "
      "over blocks on the first held-out batch at the last evaluation, mean over seeds.\n\n"
      f"{len(records)} populations, {members} members; training wall time {wall / 60:.1f} min, "
      f"process CPU time {cpu / 60:.1f} min (sum over populations).\n"
  )
  (out / "table.md").write_text(text)


# At most this many schemes share a panel of loss_vs_lr.png (pre-LN, when the sweep has it,
# drawn in each as the reference, is one of them), each in its own colour, the legend beside it.
PANEL_SCHEMES = 6


def panels(records) -> list[list[dict]]:
  """The records in groups of at most PANEL_SCHEMES, pre-LN's first (the reference) in every
  group when the sweep has one, the others in the sweep's order. A sweep of claims without a
  pre-LN reference (the width ladder: CLAIM-SCHEME-WIDTH names) gets panels of one claim each."""
  ref = next((r for r in records if r["name"].split("-L")[0] == "pre"), None)
  claims = list(dict.fromkeys(r["name"].split("-")[0] for r in records))
  if ref is None and 1 < len(claims) < len(records):
    of = [[r for r in records if r["name"].split("-")[0] == claim] for claim in claims]
    return [g[i : i + PANEL_SCHEMES] for g in of for i in range(0, len(g), PANEL_SCHEMES)]
  others = [r for r in records if r is not ref]
  size = PANEL_SCHEMES - (ref is not None)
  groups = [others[i : i + size] for i in range(0, len(others), size)] or [[]]
  return [([ref] if ref is not None else []) + g for g in groups]


def plot(records, out: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  depths = sorted({r["depth"] for r in records})

  def fraction(r, warmup):  # warmups as fractions of their run: populations may differ in steps
    return round(warmup / r["steps"], 4)

  warmups = sorted({fraction(r, w) for r in records for w in curves(r)})
  groups = panels(records)
  rows = [(g, d) for g in groups for d in depths if any(r["depth"] == d for r in g)]
  fig, axes = plt.subplots(
      len(rows), len(warmups), figsize=(6.4 * len(warmups), 3.0 * len(rows)), squeeze=False
  )
  finals = [v for r in records for by in curves(r).values() for vs in by.values() for v in vs]
  for row, (group, depth) in enumerate(rows):
    for col, warmup in enumerate(warmups):
      ax = axes[row][col]
      for i, r in enumerate(x for x in group if x["depth"] == depth):
        by_lr = next((v for w, v in curves(r).items() if fraction(r, w) == warmup), None)
        if not by_lr:
          continue
        lrs = sorted(by_lr)
        mean = [sum(by_lr[lr]) / len(by_lr[lr]) for lr in lrs]
        ref = r["name"].split("-L")[0] == "pre"
        color = "0.35" if ref else f"C{i}"
        label = r["name"] + (" (reference)" if ref else "")
        ax.plot(lrs, mean, "--" if ref else "-", color=color, marker="o", ms=3, label=label)
        lo, hi = [min(by_lr[lr]) for lr in lrs], [max(by_lr[lr]) for lr in lrs]
        ax.fill_between(lrs, lo, hi, color=color, alpha=0.12)
      ax.set_xscale("log")
      steps = "/".join(str(n) for n in sorted({r["steps"] for r in group if r["depth"] == depth}))
      ax.set_title(f"depth {depth}, warmup {warmup:.0%} of {steps} steps", fontsize=9)
      ax.set_xlabel("peak learning rate")
      ax.set_ylabel("final held-out loss")
      ax.set_ylim(min(finals) - 0.05, min(max(finals), 4.0) + 0.05)  # a diverged: ln(vocab)
      if col == len(warmups) - 1 and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
  fig.tight_layout()
  fig.savefig(out / "loss_vs_lr.png", dpi=110)
  plt.close(fig)

  fig, axes = plt.subplots(1, len(depths), figsize=(5 * len(depths), 3.6), squeeze=False)
  for r in records:
    ax = axes[0][depths.index(r["depth"])]
    top = max(m["learning_rate"] for m in r["members"])
    for warmup in sorted({m["warmup_steps"] for m in r["members"]}):
      mem = [
          m
          for m in r["members"]
          if m["learning_rate"] == top and m["warmup_steps"] == warmup and not m.get("diverged")
      ]
      if not mem or None in mem[0]["attention_logit_max"]:  # no decoder stack (ViT)
        continue
      steps = mem[0]["eval_steps"]
      mean = [sum(m["attention_logit_max"][i] for m in mem) / len(mem) for i in range(len(steps))]
      ax.plot(
          steps,
          mean,
          "-" if r["qk_norm"] else "--",
          color=color_of(r["placement"]),
          alpha=1.0 if warmup else 0.5,
          label=f"{r['placement']}, qk {'on' if r['qk_norm'] else 'off'}, warmup {warmup}",
      )
    ax.set_yscale("log")
    ax.set_title(f"depth {r['depth']}: largest attention logit, LR {top:g}")
    ax.set_xlabel("step")
  if axes[0][0].get_legend_handles_labels()[0]:
    axes[0][0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(out / "attention_logits.png", dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.sweep or not FLAGS.out:
    raise UserError(
        "--sweep and --out are required, e.g. --sweep experiments/lr_sensitivity.py "
        "--out experiments/results/lr_sensitivity"
    )
  from absl import logging

  logging.set_verbosity(logging.WARNING)
  sweep = load_sweep(FLAGS.sweep)
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  entries = sweep.populations(FLAGS.scale)
  sweeps.check_entries(sweep, entries, "population", "max_populations", FLAGS.max_populations)
  for e in entries:  # every configuration is checked before anything trains
    population_config(sweep, e, out)
  done = sweeps.read_records(out / "populations.jsonl")
  unknown = sorted(set(FLAGS.only) - {e["name"] for e in entries})
  if unknown:
    raise UserError(
        f"--only {','.join(unknown)}: not a population of {FLAGS.sweep}; its populations are "
        + ", ".join(e["name"] for e in entries)
    )
  todo = [] if FLAGS.report_only else [e for e in entries if e["name"] not in done]
  if FLAGS.only:
    todo = [e for e in todo if e["name"] in FLAGS.only]
  if FLAGS.max_populations:
    todo = todo[: FLAGS.max_populations]
  print(f"{len(entries)} populations: {len(done)} finished, {len(todo)} to run now", flush=True)
  # each population's work: its members' steps (for the time-left estimate)
  progress = sweeps.RowProgress([_work(sweep, e, out) for e in todo], stream=sys.stdout)
  for e in todo:
    progress.start(e["name"])
    record = run_population(sweep, e, out)
    sweeps.append_record(out / "populations.jsonl", record)
    done[e["name"]] = record
    progress.finish(e["name"], f"{record['cpu_s']:.0f} s CPU")
  if not FLAGS.only:  # (with --only, another process may still be reading the token cache)
    shutil.rmtree(out / "data", ignore_errors=True)
  done = sweeps.read_records(out / "populations.jsonl")  # with those other processes' too
  records = [done[e["name"]] for e in entries if e["name"] in done]
  if records:
    write_table(records, out)
    plot(records, out)
    print(f"wrote {out}/table.md, loss_vs_lr.png, attention_logits.png", flush=True)
  return 0


if __name__ == "__main__":
  cli.run_script(main)
