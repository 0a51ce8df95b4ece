"""Do the deep blocks contribute? Pre-LN against Mix-LN, LayerNorm Scaling and Peri-LN.

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_depth_use.py \
        --out experiments/results/norm_zoo/depth_use --keep_checkpoints
    python scripts/block_contribution.py --out experiments/results/norm_zoo/depth_use \
        --runs experiments/results/norm_zoo/depth_use/runs/pre-L12,...  (every population)

Mix-LN (Li et al. 2024) and LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth") say that
under pre-LN the deep blocks of a model contribute little (removing one barely changes the
loss; each turns the residual stream by a small angle), and that their placements make those
blocks count. Peri-LN (Kim et al. 2025) says that normalising each sublayer's output as well
(`sandwich`) keeps the residual stream's variance from growing with depth as pre-LN's does.
The models: the norm zoo's byte-level decoder (d_model 16, 2 heads, 1,000 steps of 4 x 16
bytes) at depths 12 and 24, for pre, mixln, scaled, sandwich and post, each one population of
3 seeds at one peak rate (1e-2 with warmup 10%, among pre-LN's best at depth 12 in the zoo).
Their checkpoints are kept for scripts/block_contribution.py; `residual_rms` per block is in
populations.jsonl.
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _zoo.BASE
LEARNING_RATE = 1e-2
SEEDS = 3
PLACEMENTS = ("pre", "mixln", "scaled", "sandwich", "post")
DEPTHS = (12, 24)


# The second round (rows named "-own"): each scheme at its own best rate in the depth-12 LM zoo
# (experiments/results/norm_zoo/lm) rather than pre-LN's, 4 seeds, from its paper's
# initialisation (`model.init=paper`: Megatron's for pre-LN and Peri-LN, N(0, 0.02) for Mix-LN
# and LN Scaling, Xavier for post-LN), Peri-LN with its embedding norm (`peri`).
OWN_RATES = {"pre": 1e-2, "mixln": 1e-2, "scaled": 1e-2, "peri": 3e-2, "post": 3e-3}
OWN_SEEDS = 4


def populations(scale: bool = False) -> list[dict]:
  common = {**_zoo.COMMON, "eval_every": 250, **(_zoo.SCALE if scale else {})}
  steps = common["steps"]

  def entry(name, placement, depth, rate, seeds, extra):
    return {
        "name": name,
        "overrides": {
            **common,
            **extra,
            "checkpoint_every": steps,
            "model.norm_placement": placement,
            "model.num_layers": depth,
            "population.seeds": seeds,
            "population.learning_rates": repr((rate,)),
            "population.warmup_steps": repr((steps // 10,)),
        },
    }

  first = [entry(f"{p}-L{d}", p, d, LEARNING_RATE, SEEDS, {}) for d in DEPTHS for p in PLACEMENTS]
  own = [
      entry(f"{p}-L{d}-own", p, d, rate, OWN_SEEDS, {"model.init": "paper"})
      for d in DEPTHS
      for p, rate in OWN_RATES.items()
  ]
  return first + own
