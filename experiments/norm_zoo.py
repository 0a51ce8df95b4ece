"""The norm-placement zoo's learning-rate sensitivity: every placement, one protocol.

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo.py \
        --out experiments/results/norm_zoo/lm
    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_translation.py \
        --out experiments/results/norm_zoo/translation

Every entry of modules/placements/ (and pre-LN with the two new norm kinds, DyT and
ScaleNorm) in the protocol of experiments/deep_postnorm.py: one population per scheme of 7
peak rates (3e-4 ... 3e-1) x warmup {0, 10% of steps} x 3 seeds = 42 members, on tiny
byte-level decoders at depth 12 (d_model 16, 2 heads, batches of 4 x 16 bytes of the bundled
corpus), trained for 1,000 steps rather than deep_postnorm's 2,000 (at 2,000 a population took
590 CPU-s on the 2-core machine and the 19 would take 3.1 of the study's 4 CPU-hours), and
evaluated every 100 steps so that steps-to-a-loss (ReZero's claim) can be read from the curves. `--scale` is the same grid at d_model 256 and depths 12 and 24 for an
accelerator. docs/norm_zoo.md says what each scheme is and what the study reads from it.
"""

import pathlib

from transformers_jax.modules.placements import PLACEMENTS
from transformers_jax.scripting import sweeps

_deep_postnorm = sweeps.load_sweep(pathlib.Path(__file__).with_name("deep_postnorm.py"), ("BASE",))

BASE = "gpt2.py:tiny"

LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
SEEDS = 3
# (population name, overrides): every built placement, then pre-LN with each new norm kind
SCHEMES = (
    [
        (name, {"model.norm_placement": name})
        for name, placement in PLACEMENTS.items()
        if not placement.unavailable
    ]
    + [
        (f"pre-{norm}", {"model.norm_placement": "pre", "model.norm": norm})
        for norm in ("dyt", "scalenorm")
    ]
    + [
        # OLMo 2 (2024): the reordered norm x + N(f(x)) with queries and keys normalised
        ("olmo2", {"model.norm_placement": "reordered", "model.qk_norm": True}),
    ]
)

# the deep post-norm study's LM protocol (experiments/deep_postnorm.py), layers scanned so that
# each depth-12 population compiles one block
COMMON = {
    **_deep_postnorm.COMMON,
    "steps": 1000,
    "eval_every": 100,
    "model.scan_layers": True,
}
SCALE = {**_deep_postnorm.SCALE}
DEPTHS = (12,)
SCALE_DEPTHS = (12, 24)


def populations(scale: bool = False) -> list[dict]:
  common = {**COMMON, **(SCALE if scale else {})}
  steps = common["steps"]
  out = []
  for depth in SCALE_DEPTHS if scale else DEPTHS:
    for name, scheme in SCHEMES:
      out.append(
          {
              "name": f"{name}-L{depth}",
              "overrides": {
                  **common,
                  **scheme,
                  "model.num_layers": depth,
                  "population.seeds": SEEDS,
                  "population.learning_rates": repr(LEARNING_RATES),
                  "population.warmup_steps": repr((0, steps // 10)),
              },
          }
      )
  return out
