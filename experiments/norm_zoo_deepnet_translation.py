"""DeepNet's claim on translation: post-LN against DeepNorm at 18+18 blocks.

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_deepnet_translation.py \
        --out experiments/results/norm_zoo/deepnet_translation

The translation half of experiments/norm_zoo_deepnet.py: the norm zoo's numbers task and
encoder-decoder (experiments/norm_zoo_translation.py: d_model 16, batches of 4 pairs) at 18
blocks per stack, where DeepNet's encoder-decoder constants apply (encoder alpha =
0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16); decoder alpha = (3M)^(1/4), beta =
(12M)^(-1/4)). Post-LN, DeepNorm and pre-LN, each one population of 3 peak rates x warmup 10%
x 2 seeds = 6 members.
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo_translation.py"), ("BASE",))

BASE = _zoo.BASE
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
SEEDS = 2
PLACEMENTS = ("post", "deepnorm", "pre")
DEPTH = 18


# The paper's own setting (Xavier for every scheme, 4 seeds: the claim is about divergence)
# beside the first study's GPT-2-init rows (2 seeds), as in experiments/norm_zoo_deepnet.py.
INITS = {"": ("gpt2", SEEDS), "-xavier": ("xavier", 4)}


def populations(scale: bool = False) -> list[dict]:
  entries = {e["name"]: e for e in _zoo.populations(scale)}
  out = []
  for suffix, (init, seeds) in INITS.items():
    for placement in PLACEMENTS:
      overrides = dict(entries[f"{placement}-L12+12"]["overrides"])
      overrides.update(
          {
              "model.num_layers": DEPTH,
              **({"model.init": init} if init != "gpt2" else {}),
              "population.seeds": seeds,
              "population.learning_rates": repr(LEARNING_RATES),
              "population.warmup_steps": repr((overrides["steps"] // 10,)),
          }
      )
      out.append({"name": f"{placement}-L{DEPTH}+{DEPTH}{suffix}", "overrides": overrides})
  return out
