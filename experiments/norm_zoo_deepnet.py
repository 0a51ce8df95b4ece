"""DeepNet's claim at depth: post-LN fails to train where DeepNorm trains (Wang et al. 2022).

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_deepnet.py \
        --out experiments/results/norm_zoo/deepnet_lm
    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_deepnet_translation.py \
        --out experiments/results/norm_zoo/deepnet_translation

DeepNet trains a 1,000-layer Transformer with DeepNorm (x <- LN(alpha x + f(x)) and its
beta-scaled Xavier initialisation) where post-LN diverges from about 100 layers onwards (their
Figure 1 and Table 1). The smallest version this machine can run: the norm zoo's byte-level
decoder (d_model 16, 2 heads, batches of 4 x 16 bytes) at 100 blocks, layers scanned, for
post-LN, DeepNorm and pre-LN, each one population of 3 peak rates x warmup 10% x 2 seeds = 6
members, 600 steps. The translation half is experiments/norm_zoo_deepnet_translation.py
(18+18 blocks, the paper's encoder-decoder constants).
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _zoo.BASE
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
SEEDS = 2
STEPS = 600
PLACEMENTS = ("post", "deepnorm", "pre")
DEPTH = 100
# The paper's own setting: every scheme (its post-LN and pre-LN baselines too) from Xavier
# initialisation, as DeepNet's pseudo-code and fairseq draw it (`model.init=xavier`), with
# 4 seeds, since the claim is about divergence. The rows named without "-xavier" are the
# first study's, at GPT-2's N(0, 0.02) (2 seeds): kept beside them.
INITS = {"": ("gpt2", SEEDS), "-xavier": ("xavier", 4)}


def populations(scale: bool = False) -> list[dict]:
  common = {
      **_zoo.COMMON,
      "steps": STEPS,
      "eval_every": STEPS // 6,
      **(_zoo.SCALE if scale else {}),
  }
  steps = common["steps"]
  return [
      {
          "name": f"{placement}-L{DEPTH}{suffix}",
          "overrides": {
              **common,
              "model.norm_placement": placement,
              "model.num_layers": DEPTH,
              **({"model.init": init} if init != "gpt2" else {}),
              "population.seeds": seeds,
              "population.learning_rates": repr(LEARNING_RATES),
              "population.warmup_steps": repr((steps // 10,)),
          },
      }
      for suffix, (init, seeds) in INITS.items()
      for placement in PLACEMENTS
  ]
