"""Deep post-norm and warmup on translation: the 2017 encoder-decoder, post-norm vs pre-norm.

    python scripts/lr_sensitivity.py --sweep experiments/deep_postnorm_translation.py \
        --out experiments/results/deep_postnorm/translation

The translation half of experiments/deep_postnorm.py (read its docstring). The task is the
bundled numbers task (digits -> English words) up to 9,999, where 7 in 10 held-out translations
have four or more words, so that corpus BLEU-4 has 4-grams to count (up to 999 most have one to
three and BLEU reads 0). The model is the 2017 one (experiments/transformer.py: sinusoids, ReLU,
tied embeddings), narrowed to d_model 16, with placement {post, pre}, at depths 6+6 and 12+12
(`--scale`: the same at d_model 256). Each placement and depth is one population of 5 peak
rates (1e-3 ... 1e-1, bracketing both placements' optima at 6+6; 4 at 12+12, without 1e-1) x
warmup {0, 10% of steps} x 3 seeds = 30 (24) members, trained for 2,000 steps on batches of 4
pairs (sources in rows of 8 tokens, targets in rows of 48). At the end each member is
scored by its held-out loss on 128 held-out numbers, and by greedy exact match and corpus BLEU
(sacrebleu) on the same 128.
"""

BASE = "transformer.py:tiny"

LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
# 12+12 costs twice 6+6 per member: on the CPU it drops 1e-1 (above both placements' optima at
# 6+6); --scale keeps every rate
RATES_BY_DEPTH = {12: (1e-3, 3e-3, 1e-2, 3e-2)}
SEEDS = 3
PLACEMENTS = ("post", "pre")
DEPTHS = (6, 12)
SCALE_DEPTHS = (6, 12)

COMMON = {
    "steps": 2000,
    "batch_size": 4,
    "seq_len": 48,  # target rows: the longest up to 9,999 is 42 bytes, plus BOS or EOS
    "data.source_len": 8,  # source rows: at most 4 digits and EOS (the encoder need not run
    # on 48 positions of padding: about 40% of the step)
    "lr_schedule": "cosine",
    "weight_decay": 0.1,
    "log_every": 100,
    "eval_every": 2000,
    "eval_batches": 32,  # 128 held-out numbers: the loss, exact match and BLEU are on all
    "data.eval_translations": 128,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "sample.max_new_tokens": 0,
    "model.d_model": 16,
    "model.num_heads": 2,
    "model.d_ff": 64,
    "model.max_len": 48,
    "model.scan_layers": True,  # one compiled block per stack: the 12+12 program compiles in
    # seconds, where unrolled it takes minutes of the 2-core machine's time
    "data.max_number": 9_999,
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
                  "population.learning_rates": repr(
                      LEARNING_RATES if scale else RATES_BY_DEPTH.get(depth, LEARNING_RATES)
                  ),
                  "population.warmup_steps": repr((0, common["steps"] // 10)),
              },
          }
      )
  return out
