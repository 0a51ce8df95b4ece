"""The translation zoo (experiments/norm_zoo_translation.py: 12+12 blocks, 3 rates x 2 warmups x
2 seeds, 600 steps) with each scheme whose paper trained from another initialisation than
GPT-2's at that initialisation (`model.init=paper`; experiments/norm_zoo_paper_init.py says
which and why).

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_translation_paper_init.py \
        --out experiments/results/norm_zoo/translation_paper_init
"""

import pathlib

from transformers_jax.scripting import sweeps

_translation = sweeps.load_sweep(
    pathlib.Path(__file__).with_name("norm_zoo_translation.py"), ("BASE",)
)
_paper = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo_paper_init.py"), ("BASE",))

BASE = _translation.BASE


def populations(scale: bool = False) -> list[dict]:
  entries = []
  for entry in _translation.populations(scale):
    name = entry["name"].rsplit("-L", 1)[0]
    for scheme, overrides in _paper.SCHEMES:
      if name == scheme:
        renamed = entry["name"].replace(f"{scheme}-L", f"{scheme}-paper-L", 1)
        entries.append({"name": renamed, "overrides": {**entry["overrides"], **overrides}})
  return entries
