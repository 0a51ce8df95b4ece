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
             are in the results README), with the training CPU time of every folder
  width_ladder/README.md, claims_by_width.png
             the width ladder (experiments/norm_zoo_width.py): a table per claim, a row per
             d_model, each scheme's best loss and rate, the claim's gap and its trend with width

A member's final loss is its last held-out loss; a diverged one, or one ending above ln(vocab),
counts as ln(vocab).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import pathlib

from absl import flags

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.scripting import output_paths, sweeps

FLAGS = cli.ScriptFlags(__doc__)
output_paths.declare(FLAGS, out=output_paths.FOLDER)  # checked before any work
flags.DEFINE_string("out", None, "The study's folder.", flag_values=FLAGS)
flags.DEFINE_float(
    "margin", 0.1, "Nats above the best seed-mean loss a trainable rate may be.", flag_values=FLAGS
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
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


def contributions(path: pathlib.Path) -> dict[str, dict]:
  """Per run of a block_contribution.py contribution.jsonl: its rate, seeds, and per seed the
  held-out loss and the first and last third's mean skip cost and angular distance."""
  if not path.exists():
    return {}
  out: dict[str, dict] = {}
  for line in path.read_text().splitlines():
    r = json.loads(line)
    depth = len(r["skip_loss_increase"])
    first, last = slice(0, depth // 3), slice(2 * depth // 3, depth)
    run = out.setdefault(r["run"], {"rate": r["learning_rate"], "seeds": [], "loss": []})
    run["seeds"].append(r["seed"])
    run["loss"].append(r["loss"])
    for key, field in (("skip", "skip_loss_increase"), ("angle", "angular_distance")):
      run.setdefault(f"{key}_first", []).append(mean(r[field][first]))
      run.setdefault(f"{key}_last", []).append(mean(r[field][last]))
  return out


def contribution_cell(run: dict, setting: str) -> str:
  return (
      f"{setting}, LR {run['rate']:g}, {len(run['seeds'])} seeds: loss {band(run['loss'])}; "
      f"skip cost, first third {band(run['skip_first'], '{:.4f}')}, last third "
      f"{band(run['skip_last'], '{:.4f}')}; angle, last third {band(run['angle_last'])}"
  )


def depth_use(out: pathlib.Path) -> list[str]:
  """The block-contribution probes: the first round (every scheme at pre-LN's rate 1e-2 from
  GPT-2's init, 3 seeds; depth_use/) beside the second (each scheme at its own best rate in the
  depth-12 zoo from its paper's init, 4 seeds; depth_use/own/, runs named -own)."""
  shared = contributions(out / "depth_use" / "contribution.jsonl")
  own = contributions(out / "depth_use" / "own" / "contribution.jsonl")
  lines = []
  for run in dict.fromkeys([*shared, *(r.removesuffix("-own") for r in own)]):
    cells = []
    if run in shared:
      cells.append(contribution_cell(shared[run], "shared rate, GPT-2's init"))
    if f"{run}-own" in own:
      cells.append(contribution_cell(own[f"{run}-own"], "own rate, its paper's init"))
    lines.append(f"| Mix-LN / LN Scaling | {run} | " + "<br>".join(cells) + " |")
  for r in records_of(out / "depth_use").values():
    lines.append(f"| Peri-LN | {r['name']} | {residual_growth(r['members'])} |")
  return lines


def depth_exponent(depths: list[int], values: list[float]) -> float:
  """Least-squares slope of log(value) on log(depth) (scripts/grad_at_init.py's exponent)."""
  xs, ys = [math.log(d) for d in depths], [math.log(v) for v in values]
  mx, my = mean(xs), mean(ys)
  return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def gradient_exponents(out: pathlib.Path, placements=("post", "pre")) -> list[str]:
  """Xiong et al.'s claim from scripts/grad_at_init.py's probes at GPT-2's init (grad_at_init/)
  and Xavier's (grad_at_init_xavier/): the exponent a of the last block's feed-forward gradient
  norm ~ L^a, on the seed mean (as its table) and per seed (the band), and last / first block
  at the largest depth."""
  lines = []
  for folder in ("grad_at_init", "grad_at_init_xavier"):
    path = out / folder / "grad_norms.jsonl"
    if not path.exists():
      continue
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for p in placements:
      rs = [r for r in records if r["placement"] == p]
      if not rs:
        continue
      depths, seeds = sorted({r["depth"] for r in rs}), sorted({r["seed"] for r in rs})
      last = {(r["depth"], r["seed"]): r["grad_norm"]["decoder"]["ffn"][-1] for r in rs}
      ratio = [
          r["grad_norm"]["decoder"]["ffn"][-1] / r["grad_norm"]["decoder"]["ffn"][0]
          for r in rs
          if r["depth"] == depths[-1]
      ]
      on_mean = depth_exponent(depths, [mean([last[d, s] for s in seeds]) for d in depths])
      per_seed = [depth_exponent(depths, [last[d, s] for d in depths]) for s in seeds]
      lines.append(
          f"| Xiong et al. | {p}, init {rs[0].get('init', 'gpt2')}, d_model {rs[0]['d_model']}, "
          f"L = {', '.join(map(str, depths))} | exponent a {on_mean:+.2f} on the seed mean, "
          f"{min(per_seed):+.2f} to {max(per_seed):+.2f} per seed ({len(seeds)} seeds); last / "
          f"first block at L = {depths[-1]}: {band(ratio, '{:.2f}')} |"
      )
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
  translation_zoo = records_of(out / "translation", "translation")
  names = ["hyper-L12+12", "mhc-L12+12", "ngpt-L12+12", "pre-L12+12"]
  rows += best_rows(translation_zoo, names, "streams (12+12 translation)")
  streams = records_of(out / "streams")
  for n in ("hyper-L12", "hyper-dynamic-L12", "mhc-L12", "ngpt-L12", "pre-value_residual-L12"):
    rows += steps_to_target(streams, [n, "pre-L12"], n.split("-L")[0])
  return rows


# The width ladder (experiments/norm_zoo_width.py): per claim, the two schemes its gap compares
# (loss of the first minus the second) and what the paper's claim says the gap should be.
WIDTH_GAPS = {
    "deepnet": ("post", "deepnorm", "a large positive gap: post-LN fails where DeepNorm trains"),
    "dyt": ("dyt", "layernorm", "a gap inside the seed bands: DyT matches LayerNorm"),
    "admin": ("admin", "pre", "a gap at or below 0: Admin trains as well as pre-LN"),
    "rezero": ("post", "rezero", "a positive gap: ReZero converges faster than post-LN"),
    "peri": (
        "peri",
        "pre",
        "a gap at or below 0, and (its premise) pre-LN's residual stream growing where "
        "Peri-LN's does not: the residual columns",
    ),
}


def width_trend(gaps: list[float], uncertainties: list[float]) -> str:
  """closing / opening / flat: |gap| at the widest width against the narrowest, a change
  counting only when larger than the two widths' uncertainties together (each half the seed
  range of the one scheme plus half the other's)."""
  change = abs(gaps[-1]) - abs(gaps[0])
  word = "flat"
  if abs(change) > uncertainties[0] + uncertainties[-1]:
    word = "opening" if change > 0 else "closing"
  if len(gaps) < 3:
    return word
  # a middle width outside the ends' range by more than its own uncertainty
  outside = max(min(gaps[0], gaps[-1]) - gaps[1], gaps[1] - max(gaps[0], gaps[-1]))
  return word + (", not monotone" if outside > uncertainties[1] else "")


def scheme_overrides(entries: dict, name: str, names: dict) -> str:
  """The model fields that set this scheme apart from the claim's others (placement, norm, DyT's
  alphas ...), width and init left out."""
  others = [entries[n] for by in names.values() for n in by.values() if n != name]
  own = {
      k: v
      for k, v in entries[name].items()
      if k.startswith("model.")
      and k not in ("model.d_model", "model.num_heads", "model.d_ff", "model.init")
      and any(o.get(k) != v for o in others)
  }
  return "".join(f", {k.removeprefix('model.')}={v}" for k, v in own.items())


def ladder_cell(record: dict) -> tuple[str, list[float]]:
  """A scheme's best seed-mean loss with its seed range and rate; a rate at the grid's end is
  marked † (the optimum may lie beyond it)."""
  at, values = best_config(record)
  rates = sorted({m["learning_rate"] for m in record["members"]})
  edge = "†" if at[0] in (rates[0], rates[-1]) else ""
  return f"{band(values)} at {at[0]:g}{edge}", values


def width_ladder(out: pathlib.Path) -> list[str]:
  """width_ladder/README.md (a table per claim: a row per width) and claims_by_width.png, from
  width_ladder/populations.jsonl and the sweep file's settings; one claims.md row per claim."""
  folder = out / "width_ladder"
  records = records_of(folder)
  if not records:
    return []
  sweep = sweeps.load_sweep(ROOT / "experiments" / "norm_zoo_width.py", ("BASE", "populations"))
  entries = {e["name"]: e["overrides"] for e in sweep.populations()}
  text = [
      "# Width ladder: the scale-dependent claims at d_model " + ", ".join(map(str, sweep.WIDTHS)),
      "",
      "Written by `python scripts/norm_zoo_report.py --out experiments/results/norm_zoo` from "
      "[populations.jsonl](populations.jsonl) (sweep: `experiments/norm_zoo_width.py`; every "
      "population's grid in [table.md](table.md)). Each cell: the scheme's best held-out loss, "
      f"the mean over {sweep.SEEDS} seeds (min-max over the seeds), at its best peak rate of the "
      "grid (warmup 10 % of the steps); † marks a best rate at the grid's end, where the optimum "
      "may lie outside it. Gap: the first scheme's best loss minus the second's, ± the two seed "
      "half-ranges added. Trend: the gap at the widest width against the narrowest; `opening` "
      "or `closing` only where |gap| moves by more than the two widths' ± together, else "
      "`flat`. CPU: process CPU-minutes of the width's populations. Heads: d_model / 8; d_ff: 4 "
      "d_model. Figure: [claims_by_width.png](claims_by_width.png) (a row per claim, a column "
      "per width).",
  ]
  rows, plot_rows, total = [], [], 0.0
  for claim, (task, schemes) in sweep.CLAIMS.items():
    a, b, expected = WIDTH_GAPS[claim]
    names = {w: {s: f"{claim}-{s}-d{w}" for s in schemes} for w in sweep.WIDTHS}
    if not all(n in records for by in names.values() for n in by.values()):
      continue
    first = records[names[sweep.WIDTHS[0]][a]]
    o = entries[first["name"]]
    rates = ", ".join(f"{x:g}" for x in ast.literal_eval(o["population.learning_rates"]))
    warmup = ast.literal_eval(o["population.warmup_steps"])[0]
    setting = "; ".join(
        f"{s}: init {entries[n].get('model.init', 'gpt2')}" + scheme_overrides(entries, n, names)
        for s, n in names[sweep.WIDTHS[0]].items()
    )
    where = (
        f"the {first['depth']}+{first['depth']} translation task"
        if task == "translation"
        else f"the byte-level decoder LM, depth {first['depth']}"
    )
    text += [
        "",
        f"## {claim}: {a} against {b}",
        "",
        f"Setting: {where}, {first['steps']} steps, peak rates {rates}, warmup {warmup} steps, "
        f"{sweep.SEEDS} seeds; {setting}. The claim: {expected}.",
        "",
    ]
    head = [*schemes, f"gap {a} - {b}"]
    if claim == "peri":
      head += [f"residual RMS last / first, {s}" for s in schemes]
    if claim == "rezero":
      head += ["first evaluation at or below post-LN's best loss"]
    text += ["| d_model | " + " | ".join(head) + " | CPU-min |", "|---" * (len(head) + 2) + "|"]
    gaps, us = [], []
    for w in sweep.WIDTHS:
      rs = {s: records[n] for s, n in names[w].items()}
      cells = {s: ladder_cell(r) for s, r in rs.items()}
      va, vb = cells[a][1], cells[b][1]
      gaps.append(mean(va) - mean(vb))
      us.append((max(va) - min(va) + max(vb) - min(vb)) / 2)
      row = [cells[s][0] for s in schemes] + [f"{gaps[-1]:+.3f} ± {us[-1]:.3f}"]
      if claim == "peri":
        for r in rs.values():
          at, _ = best_config(r)
          ms = [m for m in r["members"] if (m["learning_rate"], m["warmup_steps"]) == at]
          row.append(band([m["residual_rms"][-1] / m["residual_rms"][0] for m in ms], "{:.2f}"))
      if claim == "rezero":
        target = mean(best_config(rs["post"])[1])
        reached = {
            s: first_step_at(*seed_mean_curve(r, best_config(r)[0]), target) for s, r in rs.items()
        }
        row.append(", ".join(f"{s} step {reached[s]}" for s in schemes))
      minutes = sum(r["cpu_s"] for r in rs.values()) / 60
      total += minutes
      text.append(f"| {w} | " + " | ".join(row) + f" | {minutes:.1f} |")
    trend = width_trend(gaps, us)
    text += [
        "",
        f"Trend with width: **{trend}** (gap {gaps[0]:+.3f} ± {us[0]:.3f} at d_model "
        f"{sweep.WIDTHS[0]}, {gaps[-1]:+.3f} ± {us[-1]:.3f} at {sweep.WIDTHS[-1]}).",
    ]
    rows.append(
        f"| width ladder | {claim}: {a} - {b}, d_model "
        + ", ".join(map(str, sweep.WIDTHS))
        + " | gap "
        + ", ".join(f"{g:+.3f} ± {u:.3f}" for g, u in zip(gaps, us))
        + f": {trend} |"
    )
    plot_rows.append((claim, [[records[names[w][s]] for s in schemes] for w in sweep.WIDTHS]))
  text += ["", f"Training CPU time of the ladder: {total:.1f} CPU-min.", ""]
  (folder / "README.md").write_text("\n".join(text))
  plot_ladder(plot_rows, sweep.WIDTHS, folder / "claims_by_width.png")
  return rows


def plot_ladder(plot_rows: list, widths: tuple, path: pathlib.Path) -> None:
  """Final loss against peak rate: a row per claim, a column per width, the claim's schemes
  (seed mean, min-max band) in each panel, the legend outside the row's last panel."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  schemes = list(dict.fromkeys(r["name"].split("-")[1] for _, by in plot_rows for r in by[0]))
  fig, axes = plt.subplots(
      len(plot_rows),
      len(widths),
      figsize=(3.6 * len(widths) + 1.8, 2.5 * len(plot_rows)),
      squeeze=False,
      sharey="row",
  )
  for row, (claim, by_width) in enumerate(plot_rows):
    for col, (width, rs) in enumerate(zip(widths, by_width)):
      ax = axes[row][col]
      for r in rs:
        scheme = r["name"].split("-")[1]
        color = f"C{schemes.index(scheme) % 10}"  # one colour per scheme across the figure
        for by_lr in report.by_warmup(r).values():
          lrs = sorted(by_lr)
          ax.plot(lrs, [mean(by_lr[x]) for x in lrs], "-o", ms=3, color=color, label=scheme)
          lo, hi = [min(by_lr[x]) for x in lrs], [max(by_lr[x]) for x in lrs]
          ax.fill_between(lrs, lo, hi, color=color, alpha=0.15)
      ax.set_xscale("log")
      ax.set_xticks(lrs, [f"{x:g}" for x in lrs], minor=False)
      ax.set_xticks([], minor=True)
      task = "18+18 translation" if rs[0]["depth"] == 18 else f"LM depth {rs[0]['depth']}"
      ax.set_title(f"{claim}, d_model {width} ({task}, {rs[0]['steps']} steps)", fontsize=8)
      ax.tick_params(labelsize=7)
      if row == len(plot_rows) - 1:
        ax.set_xlabel("peak learning rate", fontsize=8)
      if col == 0:
        ax.set_ylabel("final held-out loss", fontsize=8)
    axes[row][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


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
  rows += init_scale(out) + paper_settings(out) + gradient_exponents(out) + width_ladder(out)
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
