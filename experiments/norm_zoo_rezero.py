"""ReZero's claim in its paper's setting: faster convergence than the post-LN Transformer.

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_rezero.py \
        --out experiments/results/norm_zoo/rezero

Bachlechner et al. 2020 train a 12-layer Transformer (enwiki8) with x + alpha F(x), one alpha
per layer initialised to 0 and no norms, and report 56 % faster convergence than the vanilla
(post-LN) Transformer. Their setting here: Xavier initialisation for both (`model.init=xavier`,
as their PyTorch layers draw it), the zoo's byte-level decoder at depth 12 (d_model 16, 4 x 16
bytes, 1,000 steps), held-out loss every 25 steps (fine enough to tell 1.5x apart at any
target past step 50), 3 peak rates x warmup 10% x 4 seeds per scheme: ReZero (one alpha per
block, the paper's), ReZero with one alpha per sublayer (the first zoo's form), post-LN, and
pre-LN for reference. The paper's optimizer is Adam, as here; its model is 512 wide and 12
layers, ours 16 wide.
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _zoo.BASE
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
SEEDS = 4
PLACEMENTS = ("rezero", "rezero_sublayer", "post", "pre")
DEPTH = 12


def populations(scale: bool = False) -> list[dict]:
  common = {**_zoo.COMMON, "eval_every": 25, **(_zoo.SCALE if scale else {})}
  steps = common["steps"]
  return [
      {
          "name": f"{placement}-xavier-L{DEPTH}",
          "overrides": {
              **common,
              "model.norm_placement": placement,
              "model.init": "xavier",
              "model.num_layers": DEPTH,
              "population.seeds": SEEDS,
              "population.learning_rates": repr(LEARNING_RATES),
              "population.warmup_steps": repr((steps // 10,)),
          },
      }
      for placement in PLACEMENTS
  ]
