#!/bin/bash
# Distillation vs the same student trained alone (docs/experiments.md, "Distillation").
# The teacher is the README's Quick start model: experiments/gpt2.py:cpu (4 x 128, 0.86M
# parameters) trained for its preset's TEACHER_STEPS=500 steps. The students are
# experiments/gpt2.py:tiny (2 x 64) trained for STUDENT_STEPS=200 steps, each twice on the same
# batches: alone, and with --config.task=distill.
#   1. Pilot, on seed 10 (not one of the reported seeds): the student alone and distilled with
#      temperature T in {1, 2} x soft-term weight alpha in {0.5, 0.9}; the pair with the lowest
#      held-out loss is kept.
#   2. Seeds 0, 1, 2: alone and distilled with the kept pair.
# Writes results.json and table.md here from the runs' metrics.jsonl. A finished run is not
# retrained (running it again only reloads it). From the repository root:
#   bash experiments/results/distill/run.sh [RUNS_FOLDER]
set -euo pipefail
OUT=$(dirname "$0")
RUNS=${1:-runs/distill}
TEACHER_STEPS=${TEACHER_STEPS:-500}
STUDENT_STEPS=${STUDENT_STEPS:-200}
PY=${PYTHON:-python}
COMMON="--config.sample.max_new_tokens=0 --config.eval_batches=8"
TIME="/usr/bin/time -f %U+%S -a -o $RUNS/cpu_seconds.txt"
mkdir -p "$RUNS"
touch "$RUNS/cpu_seconds.txt"
$TIME $PY -m transformers_jax.train --config experiments/gpt2.py:cpu --workdir "$RUNS/teacher" \
  --config.steps=$TEACHER_STEPS --config.eval_every=$TEACHER_STEPS $COMMON
student() {  # student SEED NAME [overrides...]
  local seed=$1 name=$2
  shift 2
  $TIME $PY -m transformers_jax.train --config experiments/gpt2.py:tiny --workdir "$RUNS/$name" \
    --config.steps=$STUDENT_STEPS --config.seed=$seed --config.eval_every=100 $COMMON "$@"
}
distilled() {  # distilled SEED T ALPHA
  student "$1" "distilled_T$2_a$3_$1" --config.task=distill \
    --config.distill.teacher="$RUNS/teacher" --config.distill.temperature=$2 \
    --config.distill.alpha=$3
}
PILOT_SEED=10
student $PILOT_SEED alone_$PILOT_SEED
for T in 1 2; do
  for alpha in 0.5 0.9; do
    distilled $PILOT_SEED $T $alpha
  done
done
KEPT=$($PY - "$RUNS" $PILOT_SEED <<'PYEOF'
import json, pathlib, sys
runs, seed = pathlib.Path(sys.argv[1]), sys.argv[2]
def final(name):
  rows = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
  return [r for r in rows if "eval_loss" in r][-1]["eval_loss"]
pairs = [(T, a) for T in ("1", "2") for a in ("0.5", "0.9")]
print(*min(pairs, key=lambda p: final(f"distilled_T{p[0]}_a{p[1]}_{seed}")))
PYEOF
)
read -r T ALPHA <<<"$KEPT"
echo "kept temperature $T, alpha $ALPHA (lowest held-out loss on seed $PILOT_SEED)"
for seed in 0 1 2; do
  student $seed alone_$seed
  distilled $seed $T $ALPHA
done
$PY - "$RUNS" "$OUT" "$TEACHER_STEPS" "$STUDENT_STEPS" "$T" "$ALPHA" "$PILOT_SEED" <<'PYEOF'
import json, pathlib, statistics, sys

runs, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
teacher_steps, student_steps, T, alpha, pilot = sys.argv[3:8]
def final(name):
  rows = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
  return [r for r in rows if "eval_loss" in r][-1]["eval_loss"]
pilot_rows = {"alone": final(f"alone_{pilot}")}
for t in ("1", "2"):
  for a in ("0.5", "0.9"):
    pilot_rows[f"T={t}, alpha={a}"] = final(f"distilled_T{t}_a{a}_{pilot}")
table = {
    "alone": [final(f"alone_{s}") for s in range(3)],
    "distilled": [final(f"distilled_T{T}_a{alpha}_{s}") for s in range(3)],
}
cpu = sum(eval(x) for x in (runs / "cpu_seconds.txt").read_text().split())
result = {
    "teacher": {"preset": "gpt2.py:cpu", "steps": int(teacher_steps), "eval_loss": final("teacher")},
    "student": {"preset": "gpt2.py:tiny", "steps": int(student_steps), "seeds": [0, 1, 2]},
    "pilot": {"seed": int(pilot), "eval_loss": pilot_rows},
    "kept": {"temperature": float(T), "alpha": float(alpha)},
    "eval_loss": table,
    "distilled_below_alone": [d < a for a, d in zip(table["alone"], table["distilled"])],
    "cpu_seconds": round(cpu, 1),
}
(out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
lines = [
    f"Pilot, seed {pilot}: held-out loss after {student_steps} steps",
    "",
    "| student | held-out loss |",
    "|---|---|",
    *(f"| {k} | {v:.4f} |" for k, v in pilot_rows.items()),
    "",
    f"Seeds 0, 1, 2, distilled with the pilot's best pair (T = {T}, alpha = {alpha})",
    "",
    "| student (gpt2.py:tiny) | seed 0 | seed 1 | seed 2 | mean |",
    "|---|---|---|---|---|",
]
for kind, label in (("alone", "trained alone"), ("distilled", "distilled from the teacher")):
  v = table[kind]
  lines.append(f"| {label} | " + " | ".join(f"{x:.4f}" for x in v) + f" | {statistics.mean(v):.4f} |")
lines.append(
    f"\nHeld-out loss (cross-entropy, nats per byte token) after {student_steps} steps; the "
    f"teacher (gpt2.py:cpu, {teacher_steps} steps) reaches {final('teacher'):.4f}. All runs: "
    f"{cpu / 60:.1f} CPU-minutes."
)
(out / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
