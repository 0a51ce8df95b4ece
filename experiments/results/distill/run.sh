#!/bin/bash
# Distillation vs the same student trained alone (docs/experiments.md, "Distillation").
# A gpt2.py:cpu teacher (4 x 128) trained for TEACHER_STEPS steps, then gpt2.py:tiny students
# (2 x 64) for STUDENT_STEPS steps with seeds 0, 1, 2: each alone and distilled from the teacher
# (--config.task=distill, temperature 2, alpha 0.5), on the same batches. Writes results.json
# and table.md here from the runs' metrics.jsonl. Run from the repository root:
#   bash experiments/results/distill/run.sh [RUNS_FOLDER]
set -euo pipefail
OUT=$(dirname "$0")
RUNS=${1:-runs/distill}
TEACHER_STEPS=${TEACHER_STEPS:-250}
STUDENT_STEPS=${STUDENT_STEPS:-200}
PY=${PYTHON:-python}
COMMON="--config.sample.max_new_tokens=0 --config.eval_batches=8"
TIME="/usr/bin/time -f %U+%S -a -o $RUNS/cpu_seconds.txt"
mkdir -p "$RUNS"
: > "$RUNS/cpu_seconds.txt"
$TIME $PY -m transformers_jax.train --config experiments/gpt2.py:cpu --workdir "$RUNS/teacher" \
  --config.steps=$TEACHER_STEPS --config.eval_every=$TEACHER_STEPS $COMMON
for seed in 0 1 2; do
  STUDENT="--config experiments/gpt2.py:tiny --config.steps=$STUDENT_STEPS --config.seed=$seed"
  STUDENT="$STUDENT --config.eval_every=100 $COMMON"
  $TIME $PY -m transformers_jax.train $STUDENT --workdir "$RUNS/alone_$seed"
  $TIME $PY -m transformers_jax.train $STUDENT --workdir "$RUNS/distilled_$seed" \
    --config.task=distill --config.distill.teacher="$RUNS/teacher" \
    --config.distill.temperature=2 --config.distill.alpha=0.5
done
$PY - "$RUNS" "$OUT" "$TEACHER_STEPS" "$STUDENT_STEPS" <<'PYEOF'
import json, pathlib, statistics, sys

runs, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def final(name):
  rows = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
  return [r for r in rows if "eval_loss" in r][-1]
teacher = final("teacher")
table = {kind: [final(f"{kind}_{s}")["eval_loss"] for s in range(3)] for kind in ("alone", "distilled")}
cpu = sum(eval(line) for line in (runs / "cpu_seconds.txt").read_text().split())
result = {
    "teacher": {"preset": "gpt2.py:cpu", "steps": int(sys.argv[3]), "eval_loss": teacher["eval_loss"]},
    "student": {"preset": "gpt2.py:tiny", "steps": int(sys.argv[4]), "seeds": [0, 1, 2]},
    "eval_loss": table,
    "distilled_below_alone": [d < a for a, d in zip(table["alone"], table["distilled"])],
    "cpu_seconds": round(cpu, 1),
}
(out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
lines = [
    "| student (gpt2.py:tiny) | seed 0 | seed 1 | seed 2 | mean |",
    "|---|---|---|---|---|",
]
for kind, label in (("alone", "trained alone"), ("distilled", "distilled from the teacher")):
  v = table[kind]
  lines.append(f"| {label} | " + " | ".join(f"{x:.4f}" for x in v) + f" | {statistics.mean(v):.4f} |")
lines.append(f"\nHeld-out loss (cross-entropy, nats per byte token) after {sys.argv[4]} steps; the "
             f"teacher (gpt2.py:cpu, {sys.argv[3]} steps) reaches {teacher['eval_loss']:.4f}. "
             f"All runs: {cpu / 60:.1f} CPU-minutes.")
(out / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
