"""Deep post-norm and warmup on translation: the 2017 encoder-decoder, post-norm vs pre-norm.

    python scripts/lr_sensitivity.py --sweep experiments/deep_postnorm_translation.py \
        --out experiments/results/deep_postnorm/translation

The translation half of experiments/deep_postnorm.py (read its docstring). The task is the
bundled numbers task (digits -> English words, up to 999). The model is the 2017 one
(experiments/transformer.py: sinusoids, ReLU, tied embeddings), narrowed to d_model 16, with
placement {post, pre}, at depth 6+6 (`--scale`: 6+6 and 12+12 at d_model 256). Each placement
is one population of 7 peak rates x warmup {0, 10% of steps} x 3 seeds = 42 members, trained for
1,000 steps on batches of 4 pairs. At the end each member is scored by its held-out loss, and by
greedy exact match and corpus BLEU (sacrebleu) on the first 8 held-out numbers. BLEU-4 is
degenerate on numbers this short: see experiments/results/deep_postnorm.
"""

BASE = "transformer.py:tiny"

LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
SEEDS = 3
PLACEMENTS = ("post", "pre")
DEPTHS = (6,)
SCALE_DEPTHS = (6, 12)

COMMON = {
    "steps": 1000,
    "batch_size": 4,
    "seq_len": 32,
    "lr_schedule": "cosine",
    "weight_decay": 0.1,
    "log_every": 100,
    "eval_every": 1000,
    "eval_batches": 8,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "sample.max_new_tokens": 0,
    "model.d_model": 16,
    "model.num_heads": 2,
    "model.d_ff": 64,
    "model.max_len": 32,
    "model.scan_layers": False,
    "data.max_number": 999,
}
SCALE = {
    "steps": 5000,
    "batch_size": 32,
    "eval_every": 5000,
    "model.d_model": 256,
    "model.num_heads": 8,
    "model.d_ff": 1024,
    "model.scan_layers": True,
    "data.max_number": 99_999,
    "seq_len": 64,
    "model.max_len": 64,
}


def populations(scale: bool = False) -> list[dict]:
  common = {**COMMON, **(SCALE if scale else {})}
  out = []
  for depth in SCALE_DEPTHS if scale else DEPTHS:
    for placement in PLACEMENTS:
      out.append(
          {
              "name": f"{placement}-L{depth}+{depth}",
              "overrides": {
                  **common,
                  "model.norm_placement": placement,
                  "model.num_layers": depth,
                  "population.seeds": SEEDS,
                  "population.learning_rates": repr(LEARNING_RATES),
                  "population.warmup_steps": repr((0, common["steps"] // 10)),
              },
          }
      )
  return out
