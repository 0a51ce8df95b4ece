"""Do Admin and DyT learn when their branches start at unit scale? (the norm zoo's init test)

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_init_scale.py \
        --out experiments/results/norm_zoo/init_scale

In the LM zoo (experiments/norm_zoo.py: GPT-2's normal init, std 0.02) Admin and pre-LN with DyT
barely learn at any rate. The hypothesis: at std 0.02 and d_model 16 every branch output is tiny.
Admin's profiled omega is then about 0.03, so each Adam step moves it by a large fraction of
itself. DyT's tanh(0.5 x) sees a residual stream of about 0.02-0.05 RMS, where it passes 1/50 of
LayerNorm's unit-scale signal. Both papers start from Xavier-like init, about 1/sqrt(d_model) =
0.25 here. This sweep reruns admin and pre-dyt at `model.init_std` 0.25, with pre-LN at 0.25 as
the control. It uses the zoo's protocol (depth 12, 1,000 steps, 3 seeds, warmup {0, 10%}) at 3
of its 7 rates (1e-3, 3e-3, 1e-2: where pre-LN, Admin and DyT had their best), to fit the
study's CPU budget.
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _zoo.BASE
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
INIT_STD = 0.25
SCHEMES = [
    ("admin", {"model.norm_placement": "admin"}),
    ("pre-dyt", {"model.norm_placement": "pre", "model.norm": "dyt"}),
    ("pre", {"model.norm_placement": "pre"}),
]


def populations(scale: bool = False) -> list[dict]:
  common = {**_zoo.COMMON, **(_zoo.SCALE if scale else {})}
  steps = common["steps"]
  return [
      {
          "name": f"{name}-L12-init{INIT_STD}",
          "overrides": {
              **common,
              **scheme,
              "model.init_std": INIT_STD,
              "model.num_layers": 12,
              "population.seeds": _zoo.SEEDS,
              "population.learning_rates": repr(LEARNING_RATES),
              "population.warmup_steps": repr((0, steps // 10)),
          },
      }
      for name, scheme in SCHEMES
  ]
