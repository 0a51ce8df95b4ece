"""μP's width sweep: does the best Adam learning rate stay put as the model widens?

    python scripts/lr_sensitivity.py --sweep experiments/mup_width.py \
        --out experiments/results/mup/width
    python scripts/mup_transfer_report.py --out experiments/results/mup

The byte-level GPT-2 decoder of 2 blocks at d_model 32, 64, 128 and 256 (4 heads, whose width
grows with d_model; d_ff 4 d_model), under the standard parametrisation and under μP with base
width 32 (where the two are the same model): one population per (parametrisation, width) of 8
peak rates a factor of 2 apart x 3 seeds, 300 steps of 8 x 64 tokens, cosine decay after a 30-step
warmup, no weight decay. What each row cost is in OUT/populations.jsonl (cpu_s).
"""

BASE = "gpt2.py:tiny"
WIDTHS = (32, 64, 128, 256)
BASE_WIDTH = 32
HEADS = 4
# 2.5e-4 .. 3.2e-2: a pilot (1 seed, 11 rates from 1.25e-4) put sp's best at 8e-3 for width 32
# and 5e-4 for width 256, mup's at 1.6e-2 for width 256: all inside this grid
LEARNING_RATES = tuple(2.5e-4 * 2**k for k in range(8))
SEEDS = 3
PARAMETRIZATIONS = ("sp", "mup")
COMMON = {
    "steps": 300,
    "batch_size": 8,
    "seq_len": 64,
    "lr_schedule": "cosine",
    "weight_decay": 0.0,
    "log_every": 50,
    "eval_every": 150,
    "eval_batches": 16,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "sample.max_new_tokens": 0,
    "model.num_layers": 2,
    "model.num_heads": HEADS,
    "model.max_len": 64,
    "model.scan_layers": False,
}


def shape(parametrization: str, width: int, depth: int = 2, base_depth: int = 2) -> dict:
  """The model overrides of one population: its width (and depth) and parametrisation."""
  out = {
      "model.d_model": width,
      "model.d_ff": 4 * width,
      "model.num_layers": depth,
      "model.parametrization": parametrization,
  }
  if parametrization != "sp":
    out["model.mup_base_width"] = BASE_WIDTH
  if parametrization == "complete_p":
    out["model.mup_base_depth"] = base_depth
  return out


def population(name: str, overrides: dict) -> dict:
  steps = COMMON["steps"]
  return {
      "name": name,
      "overrides": {
          **COMMON,
          **overrides,
          "population.seeds": SEEDS,
          "population.learning_rates": repr(LEARNING_RATES),
          "population.warmup_steps": repr((steps // 10,)),
      },
  }


def populations(scale: bool = False) -> list[dict]:
  del scale  # the CPU sweep; an accelerator would widen WIDTHS
  return [population(f"{p}-w{w}", shape(p, w)) for w in WIDTHS for p in PARAMETRIZATIONS]
