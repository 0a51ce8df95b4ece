"""DyT on the Vision Transformer: is its accuracy within LayerNorm's seed band? (Zhu et al. 2025)

    python scripts/lr_sensitivity.py --sweep experiments/norm_zoo_dyt_vit.py \
        --out experiments/results/norm_zoo/dyt_vit

"Transformers without Normalization" replaces every LayerNorm by DyT(x) = gamma * tanh(alpha x)
+ beta (alpha_0 = 0.5) and reports ViT-B/L ImageNet accuracy equal to LayerNorm's within about
0.1-0.5 points. The smallest version here: the bundled 8 x 8 digits with vit.py:tiny widened
to 4 blocks, pre-LN with layernorm against pre-LN with dyt (every norm, the final one
included), each one population of 3 peak rates x 3 seeds with its warmup of 10%, 300 steps.
The LM half of the claim is read from the norm zoo's `pre` and `pre-dyt` populations.
"""

BASE = "vit.py:tiny"

LEARNING_RATES = (1e-3, 3e-3, 1e-2)
SEEDS = 3
NORMS = ("layernorm", "dyt")
COMMON = {
    "steps": 300,
    "eval_every": 150,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "model.num_layers": 4,
}


# The paper's ViTs start from a truncated N(0, 0.02) (`model.init=gpt2`, the rows named
# without a suffix), but their patch embedding maps 768 pixel values, so DyT meets O(1)
# inputs; the bundled digits' 4-pixel patches at that init give DyT inputs of ~0.02. The
# "-xavier" rows (`model.init=xavier`, 4 seeds) give the same model O(1) activations: the
# question they answer is whether DyT's gap is one of activation scale.
INITS = {"": ("gpt2", SEEDS), "-xavier": ("xavier", 4)}


def populations(scale: bool = False) -> list[dict]:
  del scale  # the digits are the only bundled images
  return [
      {
          "name": f"pre-{norm}-vit{suffix}",
          "overrides": {
              **COMMON,
              "model.norm": norm,
              **({"model.init": init} if init != "gpt2" else {}),
              "population.seeds": seeds,
              "population.learning_rates": repr(LEARNING_RATES),
              "population.warmup_steps": repr((COMMON["steps"] // 10,)),
          },
      }
      for suffix, (init, seeds) in INITS.items()
      for norm in NORMS
  ]
