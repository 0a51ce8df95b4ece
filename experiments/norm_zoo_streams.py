"""The residual-stream schemes' headline claims, each against pre-LN in the zoo's LM protocol.

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_streams.py \
        --out experiments/results/norm_zoo/streams

Hyper-Connections (Zhu et al. 2024) replace the one residual stream by n = 4 streams mixed by
learned connections and report faster convergence than pre-LN (1.8x for their 1B OLMoE);
manifold-constrained hyper-connections (mHC, DeepSeek 2025) project the streams' mixing onto
doubly stochastic matrices and report hyper-connections' gains without their instability; nGPT
(Loshchilov et al. 2024) normalises every vector to the unit sphere and reports 4-20x fewer
steps to a given loss (with no weight decay and no warmup, as its paper trains); value
residual learning (ResFormer, Zhou et al. 2024) mixes the first block's values into every
later block's and reports the same loss with 16-20 % less data. Each runs here at the zoo's
depth 12 (d_model 16, 1,000 steps, held-out loss every 25 steps so that steps-to-a-loss can
be read), 3 rates x 4 seeds, from its paper's initialisation (N(0, 0.02) for all four:
their registry entries' paper_init); pre-LN, the baseline of all four papers, at its own
(Megatron's scaled init, GPT-2's) and at GPT-2's plain N(0, 0.02).
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _zoo.BASE
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
SEEDS = 4
DEPTH = 12
SCHEMES = {
    "pre": {"model.norm_placement": "pre"},
    "pre-megatron": {"model.norm_placement": "pre", "model.init": "megatron"},
    "hyper": {"model.norm_placement": "hyper"},
    "hyper-dynamic": {"model.norm_placement": "hyper", "model.hyper_dynamic": True},
    "mhc": {"model.norm_placement": "mhc"},
    # nGPT trains with no weight decay and no warmup (its paper's setting)
    "ngpt": {"model.norm_placement": "ngpt", "weight_decay": 0.0},
    "pre-value_residual": {"model.norm_placement": "pre", "model.value_residual": True},
}


def populations(scale: bool = False) -> list[dict]:
  common = {**_zoo.COMMON, "eval_every": 25, **(_zoo.SCALE if scale else {})}
  steps = common["steps"]
  out = []
  for name, scheme in SCHEMES.items():
    warmup = 0 if name == "ngpt" else steps // 10
    out.append(
        {
            "name": f"{name}-L{DEPTH}",
            "overrides": {
                **common,
                **scheme,
                "model.num_layers": DEPTH,
                "population.seeds": SEEDS,
                "population.learning_rates": repr(LEARNING_RATES),
                "population.warmup_steps": repr((warmup,)),
            },
        }
    )
  return out
