"""The norm-placement zoo with each scheme at its own paper's initialisation (`model.init=paper`).

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_paper_init.py \
        --out experiments/results/norm_zoo/lm_paper_init
    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_translation_paper_init.py \
        --out experiments/results/norm_zoo/translation_paper_init

The first zoo (experiments/norm_zoo.py) drew every scheme from GPT-2's N(0, 0.02), and that one
choice decides several readings: at Xavier's scale post-LN stops learning where DeepNorm trains.
These populations rerun, in the zoo's own protocol (depth 12, 7 rates x warmup {0, 10%} x 3
seeds, 1,000 steps), every scheme whose paper trained from another initialisation than GPT-2's:
each placement's registry entry names it (`paper_init`, with its source; docs/norm_zoo.md lists
them): Xavier for post-LN, DeepNorm, Admin, ReZero, T-Fixup, Sub-LN and B2T (fairseq and
tensor2tensor), Megatron's scaled output init for pre-LN (GPT-2), Peri-LN and HybridNorm. The
GPT-2-init rows stay in experiments/results/norm_zoo/lm, beside these.
"""

import pathlib

from transformers_jax.modules.placements import PLACEMENTS
from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _zoo.BASE
# the built schemes whose paper trained from another initialisation than GPT-2's
SCHEMES = [
    (name, {"model.norm_placement": name, "model.init": "paper"})
    for name, placement in PLACEMENTS.items()
    if not placement.unavailable and placement.paper_init != "gpt2"
]


def populations(scale: bool = False) -> list[dict]:
  entries = []
  for entry in _zoo.populations(scale):
    name = entry["name"].rsplit("-L", 1)[0]
    for scheme, overrides in SCHEMES:
      if name == scheme:
        renamed = entry["name"].replace(f"{scheme}-L", f"{scheme}-paper-L", 1)
        entries.append({"name": renamed, "overrides": {**entry["overrides"], **overrides}})
  return entries
