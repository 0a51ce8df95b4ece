"""DyT's claim in its paper's LLM setting: DyT matches LayerNorm (Zhu et al. 2025).

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_dyt.py \
        --out experiments/results/norm_zoo/dyt_lm

For language models the paper does not keep alpha_0 = 0.5: it sets alpha_0 per site and width
(the DyT before attention larger than the others: 0.8 and 0.2 for LLaMA 7B, lower for the wider
models) and adds a learned scalar after the embedding, initialised to sqrt(d_model). Their
LLaMA models start from N(0, 0.02) (`model.init=gpt2`, the zoo's) and train with AdamW, as
here. The paper gives no alpha_0 for a width of 16, so two pairs run: 7B's (0.8, 0.2), the
nearest it reports, and (2, 0.5), larger as the paper's trend (smaller models, larger alpha_0)
points. Each: the zoo's byte-level decoder at depth 12, 3 rates x warmup 10% x 4 seeds, with
pre-LN LayerNorm (and LayerNorm with the embedding scalar) as the control.
"""

import pathlib

from transformers_jax.scripting import sweeps

_zoo = sweeps.load_sweep(pathlib.Path(__file__).with_name("norm_zoo.py"), ("BASE",))

BASE = _zoo.BASE
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
SEEDS = 4
DEPTH = 12
RECIPE = {"model.norm": "dyt", "model.embed_scale_learned": True}
SCHEMES = {
    "layernorm": {},
    "layernorm-embed_scalar": {"model.embed_scale_learned": True},
    "dyt-llm-0.8-0.2": {**RECIPE, "model.dyt_alpha_attention": 0.8, "model.dyt_alpha": 0.2},
    "dyt-llm-2-0.5": {**RECIPE, "model.dyt_alpha_attention": 2.0, "model.dyt_alpha": 0.5},
}


def populations(scale: bool = False) -> list[dict]:
  common = {**_zoo.COMMON, **(_zoo.SCALE if scale else {})}
  steps = common["steps"]
  return [
      {
          "name": f"pre-{name}-L{DEPTH}",
          "overrides": {
              **common,
              **scheme,
              "model.norm_placement": "pre",
              "model.num_layers": DEPTH,
              "population.seeds": SEEDS,
              "population.learning_rates": repr(LEARNING_RATES),
              "population.warmup_steps": repr((steps // 10,)),
          },
      }
      for name, scheme in SCHEMES.items()
  ]
