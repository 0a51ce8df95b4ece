"""CompleteP's depth sweep: does the best Adam learning rate stay put as the model deepens?

    python scripts/lr_sensitivity.py --sweep experiments/mup_depth.py \
        --out experiments/results/mup/depth
    python scripts/mup_transfer_report.py --out experiments/results/mup

The width sweep's decoder (experiments/mup_width.py: its rates, seeds, steps and batches) at
d_model 64 and 2, 4, 8 and 16 blocks, under μP (base width 64: at this one width the same as the
standard parametrisation) and under CompleteP with base depth 2 (each residual branch times
2 / L, Adam's epsilon scaled by depth): one population per (parametrisation, depth).
"""

import pathlib

from transformers_jax.scripting import sweeps

_width = sweeps.load_sweep(pathlib.Path(__file__).with_name("mup_width.py"), ("BASE",))

BASE = _width.BASE
WIDTH = 64
DEPTHS = (2, 4, 8, 16)
BASE_DEPTH = 2
PARAMETRIZATIONS = ("mup", "complete_p")


def populations(scale: bool = False) -> list[dict]:
  del scale
  out = []
  for depth in DEPTHS:
    for p in PARAMETRIZATIONS:
      shape = _width.shape(p, WIDTH, depth, BASE_DEPTH)
      shape["model.mup_base_width"] = WIDTH
      out.append(_width.population(f"{p}-L{depth}", shape))
  return out
