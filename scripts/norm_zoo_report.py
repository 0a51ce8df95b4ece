"""The norm zoo study's tables and the figures each paper's claim is read from.

    python scripts/norm_zoo_report.py --out experiments/results/norm_zoo

Reads what the study's commands (docs/norm_zoo.md) wrote under OUT: lm/ and translation/
(experiments/norm_zoo.py, norm_zoo_translation.py), deepnet_lm/ and deepnet_translation/
(norm_zoo_deepnet*.py), depth_use/ (norm_zoo_depth_use.py with its contribution.jsonl from
scripts/block_contribution.py), dyt_vit/ (norm_zoo_dyt_vit.py), init_scale/
(norm_zoo_init_scale.py) and amplification/ (scripts/amplification.py); whatever is missing is
left out. Writes

  table.md   every scheme on the LM (depth 12) and translation (12+12), per warmup: best peak
             rate, its seed-mean final loss with the min-max over seeds, the trainable range,
             the LR sensitivity and the diverged members (scripts/deep_postnorm_report.py's
             table)
  bleu.md    translation: greedy BLEU and exact match per scheme, warmup and rate
  claims.md  per paper, the measured figures its claim is read from (the readings themselves
             are in the results README)

A member's final loss is its last held-out loss; a diverged one, or one ending above ln(vocab),
counts as ln(vocab).
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string("out", None, "The study's folder.", flag_values=FLAGS)
flags.DEFINE_float(
    "margin", 0.1, "Nats above the best seed-mean loss a trainable rate may be.", flag_values=FLAGS
)

_spec = importlib.util.spec_from_file_location(
    "deep_postnorm_report", pathlib.Path(__file__).with_name("deep_postnorm_report.py")
)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)
mean = report.mean


def records_of(folder: pathlib.Path, task: str = "lm") -> dict[str, dict]:
  path = folder / "populations.jsonl"
  if not path.exists():
    return {}
  out = {}
  for line in path.read_text().splitlines():
    if line.strip():
      r = json.loads(line)
      out[r["name"]] = {**r, "task": task}
  return out


def best_config(record: dict, key: str = "loss") -> tuple[tuple, list[float]]:
  """((rate, warmup), per-seed values) of the configuration with the best seed mean: the lowest
  final loss, or the highest of another member field (eval_accuracy)."""
  cells = {}
  for warmup, by_lr in report.by_warmup(record, key).items():
    for lr, values in by_lr.items():
      cells[(lr, warmup)] = values
  pick = min if key == "loss" else max
  at = pick(cells, key=lambda c: mean(cells[c]))
  return at, cells[at]


def band(values: list[float], fmt: str = "{:.3f}") -> str:
  return f"{fmt.format(mean(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def seed_mean_curve(record: dict, at: tuple) -> tuple[list[int], list[float]]:
  """The held-out loss curve (evaluation steps, seed mean) of configuration `at`."""
  members = [m for m in record["members"] if (m["learning_rate"], m["warmup_steps"]) == at]
  curves = [m["eval_losses"] for m in members]
  return members[0]["eval_steps"], [mean(v) for v in zip(*curves)]


def first_step_at(steps: list[int], curve: list[float], target: float) -> int | None:
  return next((s for s, v in zip(steps, curve) if v <= target), None)


def deepnet(out: pathlib.Path) -> list[str]:
  lines = []
  for folder, task in (("deepnet_lm", "lm"), ("deepnet_translation", "translation")):
    records = records_of(out / folder, task)
    for r in records.values():
      initial = math.log(r["vocab_size"])
      at, values = best_config(r)
      diverged = sum(bool(m.get("diverged")) for m in r["members"])
      lines.append(
          f"| DeepNet | {r['name']} ({task}) | best loss {band(values)} at LR {at[0]:g}; "
          f"{diverged}/{len(r['members'])} members diverged; initial loss {initial:.2f} |"
      )
  return lines


def admin(out: pathlib.Path) -> list[str]:
  path = out / "amplification" / "amplification.jsonl"
  if not path.exists():
    return []
  records = [json.loads(line) for line in path.read_text().splitlines()]
  depths = sorted({r["depth"] for r in records})
  lines = []
  for p, std in dict.fromkeys((r["placement"], r["init_std"]) for r in records):
    means = [
        mean(
            [
                r["relative_change"]
                for r in records
                if (r["placement"], r["init_std"], r["depth"]) == (p, std, d)
            ]
        )
        for d in depths
    ]
    lines.append(
        f"| Admin | {p}, init std {std:g} | relative output change at N = "
        + ", ".join(f"{d}: {m:.2e}" for d, m in zip(depths, means))
        + f"; N={depths[-1]} / N={depths[0]} = {means[-1] / means[0]:.2f} |"
    )
  return lines


def rezero(lm: dict) -> list[str]:
  names = [f"{p}-L12" for p in ("pre", "post", "rezero")]
  if not all(n in lm and "eval_losses" in lm[n]["members"][0] for n in names):
    return []
  best = {n: best_config(lm[n]) for n in names}
  target = max(mean(v) for _, v in best.values())  # a loss all three reach
  steps = {}
  for n in names:
    evals, curve = seed_mean_curve(lm[n], best[n][0])
    steps[n] = first_step_at(evals, curve, target)
  return [
      f"| ReZero | {n} at its best LR {best[n][0][0]:g}, warmup {best[n][0][1]} | final "
      f"{band(best[n][1])}; first evaluation at or below {target:.3f} (the worst of the three "
      f"best losses): step {steps[n]} |"
      for n in names
  ]


def depth_use(out: pathlib.Path) -> list[str]:
  path = out / "depth_use" / "contribution.jsonl"
  lines = []
  if path.exists():
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for run in dict.fromkeys(r["run"] for r in records):
      rs = [r for r in records if r["run"] == run]
      depth = len(rs[0]["skip_loss_increase"])
      deep = slice(2 * depth // 3, depth)
      skip = mean([mean(r["skip_loss_increase"][deep]) for r in rs])
      angle = mean([mean(r["angular_distance"][deep]) for r in rs])
      loss = mean([r["loss"] for r in rs])
      lines.append(
          f"| Mix-LN / LN Scaling | {run} | held-out loss {loss:.3f}; last third of the blocks: "
          f"loss increase when one is skipped {skip:.4f}, angular distance {angle:.3f} |"
      )
  for r in records_of(out / "depth_use").values():
    lines.append(f"| Peri-LN | {r['name']} | {residual_growth(r['members'])} |")
  return lines


def residual_growth(members: list[dict]) -> str:
  """The residual stream's RMS leaving the first and the last block at the last evaluation,
  and their ratio, seed mean (min-max)."""
  first = [m["residual_rms"][0] for m in members]
  last = [m["residual_rms"][-1] for m in members]
  growth = [b / a for a, b in zip(first, last)]
  return (
      f"residual RMS leaving block 1 {band(first, '{:.3g}')}, the last block "
      f"{band(last, '{:.3g}')}; last / first {band(growth, '{:.2f}')}"
  )


def peri_ln(lm: dict) -> list[str]:
  lines = []
  for n in ("pre-L12", "sandwich-L12"):
    if n in lm and "residual_rms" in lm[n]["members"][0]:
      at, _ = best_config(lm[n])
      ms = [m for m in lm[n]["members"] if (m["learning_rate"], m["warmup_steps"]) == at]
      lines.append(f"| Peri-LN | {n} (zoo, best LR {at[0]:g}) | {residual_growth(ms)} |")
  return lines


def dyt(lm: dict, out: pathlib.Path) -> list[str]:
  lines = []
  for n in ("pre-L12", "pre-dyt-L12"):
    if n in lm:
      at, values = best_config(lm[n])
      lines.append(f"| DyT | {n} (LM) | best loss {band(values)} at LR {at[0]:g}, warmup {at[1]} |")
  for r in records_of(out / "dyt_vit").values():
    at, values = best_config(r)
    acc_at, acc = best_config(r, "eval_accuracy")
    lines.append(
        f"| DyT | {r['name']} | best loss {band(values)} at LR {at[0]:g}; best accuracy "
        f"{band(acc)} at LR {acc_at[0]:g} |"
    )
  return lines


def init_scale(out: pathlib.Path) -> list[str]:
  """Admin, DyT and pre-LN rerun at init std 0.25 (experiments/norm_zoo_init_scale.py)."""
  lines = []
  for r in records_of(out / "init_scale").values():
    at, values = best_config(r)
    lines.append(
        f"| Admin, DyT (init) | {r['name']} | best loss {band(values)} at LR {at[0]:g}, "
        f"warmup {at[1]} |"
    )
  return lines


def steps_to_target(records: dict, names: list[str], label: str) -> list[str]:
  """Each population's best configuration and the first evaluation at which its seed-mean
  held-out loss reaches the worst of their best losses (a loss every one of them reaches)."""
  names = [n for n in names if n in records and "eval_losses" in records[n]["members"][0]]
  if len(names) < 2:
    return []
  best = {n: best_config(records[n]) for n in names}
  target = max(mean(v) for _, v in best.values())
  lines = []
  for n in names:
    evals, curve = seed_mean_curve(records[n], best[n][0])
    lines.append(
        f"| {label} | {n} at LR {best[n][0][0]:g}, warmup {best[n][0][1]} | final "
        f"{band(best[n][1])}; first evaluation at or below {target:.3f}: step "
        f"{first_step_at(evals, curve, target)} |"
    )
  return lines


def best_rows(records: dict, names: list[str], label: str) -> list[str]:
  lines = []
  for n in names:
    if n in records:
      at, values = best_config(records[n])
      diverged = sum(bool(m.get("diverged")) for m in records[n]["members"])
      lines.append(
          f"| {label} | {n} | best loss {band(values)} at LR {at[0]:g}, warmup {at[1]}; "
          f"{diverged}/{len(records[n]['members'])} diverged |"
      )
  return lines


def paper_settings(out: pathlib.Path) -> list[str]:
  """The second round: each claim in its paper's own setting (docs/norm_zoo.md lists the
  commands), beside the first zoo's GPT-2-init rows."""
  lm, paper = records_of(out / "lm"), records_of(out / "lm_paper_init")
  translation = records_of(out / "translation_paper_init", "translation")
  rows = best_rows(paper, ["post-paper-L12", "deepnorm-paper-L12", "pre-paper-L12"], "DeepNet")
  rows += best_rows(
      translation, ["post-paper-L12+12", "deepnorm-paper-L12+12", "pre-paper-L12+12"], "DeepNet"
  )
  rows += best_rows(paper, ["admin-paper-L12", "post-paper-L12"], "Admin")
  rows += best_rows(translation, ["admin-paper-L12+12", "post-paper-L12+12"], "Admin")
  rezero = records_of(out / "rezero")
  rows += steps_to_target(rezero, ["rezero-xavier-L12", "post-xavier-L12"], "ReZero")
  rows += steps_to_target(rezero, ["rezero-xavier-L12", "pre-xavier-L12"], "ReZero")
  rows += best_rows(rezero, ["rezero_sublayer-xavier-L12"], "ReZero")
  dyt = records_of(out / "dyt_lm")
  rows += best_rows(dyt, list(dyt), "DyT (LLM recipe)")
  for n in ("pre-paper-L12", "peri-paper-L12"):
    if n in paper:
      at, _ = best_config(paper[n])
      ms = [m for m in paper[n]["members"] if (m["learning_rate"], m["warmup_steps"]) == at]
      rows.append(f"| Peri-LN | {n} (best LR {at[0]:g}) | {residual_growth(ms)} |")
  rows += best_rows(paper, ["hybrid-paper-L12", "pre-paper-L12"], "HybridNorm")
  rows += best_rows(lm, ["olmo2-L12", "reordered-L12"], "OLMo 2")
  streams = records_of(out / "streams")
  for n in ("hyper-L12", "hyper-dynamic-L12", "mhc-L12", "ngpt-L12", "pre-value_residual-L12"):
    rows += steps_to_target(streams, [n, "pre-L12"], n.split("-L")[0])
  return rows


def cost(out: pathlib.Path) -> str:
  """The training CPU time of every population under OUT, from its populations.jsonl line."""
  folders = sorted(p.parent for p in out.glob("*/populations.jsonl"))
  parts = []
  for folder in folders:
    records = records_of(folder).values()
    parts.append((folder.name, len(records), sum(r["cpu_s"] for r in records) / 60))
  total = sum(minutes for _, _, minutes in parts)
  return (
      f"Training CPU time: {total:.1f} CPU-min over {sum(n for _, n, _ in parts)} populations ("
      + ", ".join(f"{name} {n}: {minutes:.1f}" for name, n, minutes in parts)
      + "); the probes' time is not in it."
  )


def main(argv=None) -> int:
  cli.parse_script_flags(FLAGS, argv)
  if not FLAGS.out:
    raise UserError("--out is required, e.g. --out experiments/results/norm_zoo")
  out = pathlib.Path(FLAGS.out)
  lm = records_of(out / "lm")
  translation = records_of(out / "translation", "translation")
  zoo = list(lm.values()) + list(translation.values())
  if not zoo:
    raise UserError(
        f"--out {out}: no lm/populations.jsonl or translation/populations.jsonl there; run the "
        "study's commands (docs/norm_zoo.md) first"
    )
  title = "final loss against peak learning rate, by scheme and warmup"
  report.write_table(zoo, out, FLAGS.margin, title=title, heading="Norm zoo")
  report.write_bleu(zoo, out, heading="Norm zoo")
  rows = deepnet(out) + admin(out) + rezero(lm) + depth_use(out) + peri_ln(lm) + dyt(lm, out)
  rows += init_scale(out) + paper_settings(out)
  (out / "claims.md").write_text(
      "# Norm zoo: the figures each paper's claim is read from\n\n"
      "| paper | run | measured |\n|---|---|---|\n"
      + "\n".join(rows)
      + "\n\nLosses are held-out nats per token, seed mean (min-max over seeds). Commands: "
      "docs/norm_zoo.md; readings: README.md.\n\n" + cost(out) + "\n"
  )
  print(cost(out))
  print(f"wrote {out}/table.md, bleu.md, claims.md", flush=True)
  return 0


if __name__ == "__main__":
  cli.run_script(main)
