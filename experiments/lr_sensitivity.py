"""Learning-rate sensitivity of norm placement, qk-layernorm and warmup, with seeds.

    python scripts/lr_sensitivity.py --sweep experiments/lr_sensitivity.py \
        --out experiments/results/lr_sensitivity

After Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities"): the final loss of each configuration is measured across a learning-rate grid
spanning three orders of magnitude, with several seeds, instead of at one rate with one seed
(experiments/norm_ablation.py, which this sweep supersedes; it runs through the same script). A configuration is stable when its
loss stays near its best over a wide range of rates.

Grid: placement {pre, post, sandwich} x qk_norm {off, on} x depth {2, 4} = 12 populations, each
of 7 learning rates (1e-4 ... 1e-1) x warmup {0, 10% of steps} x 3 seeds = 42 members trained as
one vmapped program (transformers_jax/train/population.py), 1,000 steps each: 504 models. The
models are tiny byte-level decoders (gpt2.py:tiny narrowed to d_model 32, batches of 4 x 16
bytes) on the bundled corpus, sized so the whole sweep fits in an hour on a 2-core CPU. `--scale` is the same sweep at a size
meant for an accelerator.

A sweep file gives BASE (`<config file>:<preset>`) and `populations(scale) -> [{"name",
"overrides"}]`, overrides being dotted config fields (population lists included).
"""

BASE = "gpt2.py:tiny"

LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
SEEDS = 3
PLACEMENTS = ("pre", "post", "sandwich")
QK_NORMS = (False, True)

COMMON = {
    "steps": 1000,
    "batch_size": 4,
    "seq_len": 16,
    "lr_schedule": "cosine",
    "weight_decay": 0.1,
    "log_every": 50,
    "eval_every": 100,
    "eval_batches": 16,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "sample.max_new_tokens": 0,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.max_len": 32,
    "model.scan_layers": False,
}
DEPTHS = (2, 4)

SCALE = dict(
    COMMON,
    **{
        "steps": 5000,
        "batch_size": 32,
        "seq_len": 128,
        "log_every": 100,
        "eval_every": 500,
        "eval_batches": 8,
        "model.d_model": 256,
        "model.num_heads": 8,
        "model.max_len": 128,
        "model.scan_layers": True,
    },
)
SCALE_DEPTHS = (6, 12)


def populations(scale: bool = False) -> list[dict]:
  common, depths = (SCALE, SCALE_DEPTHS) if scale else (COMMON, DEPTHS)
  warmups = (0, common["steps"] // 10)
  out = []
  for depth in depths:
    for placement in PLACEMENTS:
      for qk in QK_NORMS:
        out.append(
            {
                "name": f"{placement}-qk{'on' if qk else 'off'}-L{depth}",
                "overrides": {
                    **common,
                    "model.norm_placement": placement,
                    "model.qk_norm": qk,
                    "model.num_layers": depth,
                    "population.seeds": SEEDS,
                    "population.learning_rates": repr(LEARNING_RATES),
                    "population.warmup_steps": repr(warmups),
                },
            }
        )
  return out
