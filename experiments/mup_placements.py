"""Does μP's rate transfer hold beyond pre-LN? The width sweep under post-LN, sandwich and
DeepNorm.

    python scripts/lr_sensitivity.py --sweep experiments/mup_placements.py \
        --out experiments/results/mup/placements
    python scripts/mup_transfer_report.py --out experiments/results/mup

experiments/mup_width.py's populations (sp and mup at d_model 32..256, 2 blocks, the same rates,
seeds and steps) with model.norm_placement set to post, sandwich or deepnorm; pre-LN's are the
width sweep's own.
"""

import pathlib

from transformers_jax.scripting import sweeps

_width = sweeps.load_sweep(pathlib.Path(__file__).with_name("mup_width.py"), ("BASE",))

BASE = _width.BASE
PLACEMENTS = ("post", "sandwich", "deepnorm")


def populations(scale: bool = False) -> list[dict]:
  del scale
  out = []
  for placement in PLACEMENTS:
    for width in _width.WIDTHS:
      for p in _width.PARAMETRIZATIONS:
        shape = {**_width.shape(p, width), "model.norm_placement": placement}
        out.append(_width.population(f"{placement}-{p}-w{width}", shape))
  return out
