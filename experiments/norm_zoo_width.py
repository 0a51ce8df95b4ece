"""The width ladder: the norm zoo's scale-dependent claims at d_model 16, 32 and 64.

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_width.py \
        --out experiments/results/norm_zoo/width_ladder

Several readings of the zoo may depend on its width of 16 rather than on the schemes: whether
post-LN trains at depth from Xavier's init (DeepNet), whether DyT matches LayerNorm, whether
Admin closes on pre-LN, how fast ReZero converges against post-LN, and how the residual stream
grows under Peri-LN against pre-LN. Each claim's populations run here at d_model 16, 32 and 64
(2, 4 and 8 heads of 8; d_ff 4 d_model), each scheme at its claim's paper setting, one
population of 3 peak rates x warmup 10% x 3 seeds (the seed band); the trend with width is
read in the folder's README (closing, opening or flat). DeepNet's claim runs on the 18+18
translation task (the zoo's depth where post-LN fails at Xavier's init), the others on the
zoo's byte-level decoder at depth 12 for 1,000 steps.
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))
_deepnet = sweeps.load_sweep(
    pathlib.Path(__file__).with_name("norm_zoo_deepnet_translation.py"), ("BASE",)
)

BASE = _zoo.BASE  # the translation entries name their own (`base`)
WIDTHS = (16, 32, 64)
SEEDS = 3
LM_RATES = (3e-3, 1e-2, 3e-2)
DYT = {"model.norm": "dyt", "model.embed_scale_learned": True}
# claim -> (task, {scheme: overrides}); each scheme in the claim paper's setting
CLAIMS = {
    "deepnet": (
        "translation",
        {
            p: {"model.norm_placement": p, "model.init": "xavier"}
            for p in ("post", "deepnorm", "pre")
        },
    ),
    "dyt": (
        "lm",
        {
            "layernorm": {"model.norm_placement": "pre"},
            "dyt": {
                "model.norm_placement": "pre",
                **DYT,
                "model.dyt_alpha_attention": 0.8,
                "model.dyt_alpha": 0.2,
            },
        },
    ),
    "admin": (
        "lm",
        {p: {"model.norm_placement": p, "model.init": "xavier"} for p in ("admin", "pre")},
    ),
    "rezero": (
        "lm",
        {p: {"model.norm_placement": p, "model.init": "xavier"} for p in ("rezero", "post")},
    ),
    "peri": (
        "lm",
        {p: {"model.norm_placement": p, "model.init": "megatron"} for p in ("peri", "pre")},
    ),
}


def _width(d: int) -> dict:
  return {"model.d_model": d, "model.num_heads": d // 8, "model.d_ff": 4 * d}


def populations(scale: bool = False) -> list[dict]:
  del scale  # the ladder is the small-scale question; the zoo's --scale grids are the large one
  translation = {e["name"]: e for e in _deepnet.populations(False)}
  out = []
  for claim, (task, schemes) in CLAIMS.items():
    for width in WIDTHS:
      for scheme, overrides in schemes.items():
        entry = {}
        if task == "translation":
          base = dict(translation[f"{scheme}-L18+18-xavier"]["overrides"])
          rates, entry["base"] = _deepnet.LEARNING_RATES, _deepnet.BASE
        else:
          base = {**_zoo.COMMON, "model.num_layers": 12}
          rates = LM_RATES
        steps = base["steps"]
        out.append(
            {
                **entry,
                "name": f"{claim}-{scheme}-d{width}",
                "overrides": {
                    **base,
                    **overrides,
                    **_width(width),
                    "population.seeds": SEEDS,
                    "population.learning_rates": repr(rates),
                    "population.warmup_steps": repr((steps // 10,)),
                },
            }
        )
  return out
