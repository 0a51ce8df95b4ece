"""Deep post-norm and warmup: the claim tested where it is made, at depth 12.

    python scripts/lr_sensitivity.py --sweep experiments/deep_postnorm.py \
        --out experiments/results/deep_postnorm/lm
    python scripts/lr_sensitivity.py --sweep experiments/deep_postnorm_translation.py \
        --out experiments/results/deep_postnorm/translation
    python scripts/grad_at_init.py --out experiments/results/deep_postnorm/grad_at_init

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture"): a post-norm
Transformer's gradients near the output are large at initialisation whatever its depth, so
without a learning-rate warmup it fails to train, while pre-norm trains without one. The
depth-4 study (experiments/lr_sensitivity.py) found warmup did not widen post-norm's range of
trainable rates; this sweep asks again at depth 12, with a longer warmup too.

Language modelling: placement {post, pre} at depth 12, each one population of 7 peak learning
rates (3e-4 ... 3e-1) x warmup {0, 10%, 25% of steps} x 3 seeds = 63 members, 2,000 steps:
126 models. They are tiny byte-level decoders (d_model 16, 2 heads, batches of 4 x 16 bytes of
the bundled corpus), so that the study fits a shared 2-core CPU: about 7 CPU-minutes per
population. `--scale` is the same grid at d_model 256, batches of 32 x 128 and 5,000 steps, with
sandwich too and depths 12 and 24, for an accelerator. Translation is
experiments/deep_postnorm_translation.py; results and reading: experiments/results/deep_postnorm.
"""

BASE = "gpt2.py:tiny"

LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
SEEDS = 3
PLACEMENTS = ("post", "pre", "sandwich")
SCALE_PLACEMENTS = ("post", "pre", "sandwich")
DEPTHS = (12,)

COMMON = {
    "steps": 2000,
    "batch_size": 4,
    "seq_len": 16,
    "lr_schedule": "cosine",
    "weight_decay": 0.1,
    "log_every": 100,
    "eval_every": 250,
    "eval_batches": 16,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "sample.max_new_tokens": 0,
    "model.d_model": 16,
    "model.num_heads": 2,
    "model.max_len": 32,
    "model.scan_layers": False,
}
SCALE = {
    "steps": 5000,
    "batch_size": 32,
    "seq_len": 128,
    "eval_every": 500,
    "eval_batches": 8,
    "model.d_model": 256,
    "model.num_heads": 8,
    "model.max_len": 128,
    "model.scan_layers": True,
}
SCALE_DEPTHS = (12, 24)


def populations(scale: bool = False) -> list[dict]:
  common = {**COMMON, **(SCALE if scale else {})}
  steps = common["steps"]
  out = []
  for depth in SCALE_DEPTHS if scale else DEPTHS:
    for placement in SCALE_PLACEMENTS if scale else PLACEMENTS:
      out.append(
          {
              "name": f"{placement}-L{depth}",
              "overrides": {
                  **common,
                  "model.norm_placement": placement,
                  "model.num_layers": depth,
                  "population.seeds": SEEDS,
                  "population.learning_rates": repr(LEARNING_RATES),
                  "population.warmup_steps": repr((0, steps // 10, steps // 4)),
              },
          }
      )
  return out
