"""The norm-placement zoo on translation: the 2017 encoder-decoder at 12+12, every placement.

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_translation.py \
        --out experiments/results/norm_zoo/translation

The translation half of experiments/norm_zoo.py, in the protocol of
experiments/deep_postnorm_translation.py (the bundled numbers task up to 9,999, d_model 16,
batches of 4 pairs, 2,000 steps, held-out loss, greedy exact match and BLEU on 128 numbers):
per scheme one population of 3 peak rates (3e-3, 1e-2, 3e-2) x warmup {0, 10%} x 2 seeds = 12
members at depth 12+12, trained for 600 steps rather than 2,000 (a 3-seed population of 18
members cost 372 CPU-s on the 2-core machine; 2,000 steps and 4 rates would put the study far
over its 4 CPU-hour budget). Both stacks of the encoder-decoder (and its cross-attention) take the
scheme, with the encoder-decoder constants where the paper gives them (DeepNet, Sub-LN).
"""

import pathlib

from transformers_jax.scripting import sweeps

_translation = sweeps.load_sweep(
    pathlib.Path(__file__).with_name("deep_postnorm_translation.py"), ("BASE",)
)
_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _translation.BASE
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
STEPS = 600
# 2 seeds, not 3: at 600 steps a 3-seed population cost 372 CPU-s on the 2-core machine, and
# the 19 would put the study over its 4 CPU-hour budget
SEEDS = 2
DEPTHS = (12,)


def populations(scale: bool = False) -> list[dict]:
  common = {**_translation.COMMON, "steps": STEPS, "eval_every": STEPS}
  common = {**common, **(_translation.SCALE if scale else {})}
  out = []
  for depth in DEPTHS:
    for name, scheme in _zoo.SCHEMES:
      out.append(
          {
              "name": f"{name}-L{depth}+{depth}",
              "overrides": {
                  **common,
                  **scheme,
                  "model.num_layers": depth,
                  "population.seeds": SEEDS,
                  "population.learning_rates": repr(LEARNING_RATES),
                  "population.warmup_steps": repr((0, common["steps"] // 10)),
              },
          }
      )
  return out
