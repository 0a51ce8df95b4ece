"""The deep post-norm LM sweep at the Xavier-like initialisation, where the probe finds the
paper's gradient scaling.

    python scripts/lr_sensitivity.py --sweep experiments/deep_postnorm_xavier.py \
        --out experiments/results/deep_postnorm/lm_xavier [--scale]

experiments/deep_postnorm.py's populations (the same grid, names with `-xavier` added) with every
weight initialised at std 0.25 = 1/sqrt(d_model) for its d_model-16 layers instead of the
project's 0.02. The probe (scripts/grad_at_init.py --init_std 0.25) finds post-norm's gradient
near the output large and flat in depth at this init, and pre-norm's shrinking as about
1/sqrt(L); at 0.02 both are flat. Under --scale (d_model 256) the std stays 0.25, which is no
longer 1/sqrt(d_model): set INIT_STD to 0.0625 there.
"""

from transformers_jax.scripting import sweeps

LM = sweeps.load_sweep(sweeps.ROOT / "experiments" / "deep_postnorm.py", ("BASE", "populations"))
BASE = LM.BASE
INIT_STD = 0.25


def populations(scale: bool = False) -> list[dict]:
  return [
      {"name": f"{e['name']}-xavier", "overrides": {**e["overrides"], "model.init_std": INIT_STD}}
      for e in LM.populations(scale)
  ]
