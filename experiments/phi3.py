"""Phi-3 (Abdin et al., 2024, "Phi-3 Technical Report") and Phi-4 (Abdin et al., 2024, "Phi-4
Technical Report"), as released (Phi3ForCausalLM; config values from the Hugging Face configs
microsoft/Phi-3-mini-4k-instruct, microsoft/Phi-3-medium-4k-instruct and microsoft/phi-4).

Llama's blocks (pre-norm RMSNorm, eps 1e-5; SwiGLU; no biases; an untied head) whose
checkpoints fuse the query, key and value projections into one tensor and the gate and up
projections into another (interop/phi3.py splits them). Phi-3's 4k models slide a window of
2,047 positions over every layer (model.sliding_window) with RoPE at theta 10,000 over a
32,064-token vocabulary; Phi-4 attends fully over 16,384 positions with RoPE at 250,000 and a
100,352-row vocabulary. Counts are transformers' Phi3ForCausalLM built from each config on the
meta device:

| preset   | layers | d_model | heads / kv | d_ff   | parameters     |
|----------|--------|---------|------------|--------|----------------|
| 3-mini   | 32     | 3,072   | 32 / 32    | 8,192  | 3,821,079,552  |
| 3-medium | 40     | 5,120   | 40 / 10    | 17,920 | 13,960,238,080 |
| 4        | 40     | 5,120   | 40 / 10    | 17,920 | 14,659,507,200 |

Phi-3's 128k-context models scale RoPE by "longrope", and Phi-4-mini rotates 3/4 of each head:
neither has a counterpart here. `tiny` is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

PHI3 = dict(
    family="decoder",
    positions="rope",
    rope_theta=1e4,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-5,
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    vocab_size=32064,
    sliding_window=2047,
    max_len=4096,
    dropout=0.0,
)
SOURCE = "released Phi-3 (4k) and Phi-4 checkpoints (Phi3ForCausalLM; microsoft/Phi-3-*, phi-4)"


def _size(layers, d_model, heads, kv_heads, d_ff, published, **extra):
  return dict(
      num_layers=layers,
      d_model=d_model,
      num_heads=heads,
      num_kv_heads=kv_heads,
      d_ff=d_ff,
      scan_layers=True,
      published_params=published,
      **extra,
  )


PRESETS = {
    "tiny": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        d_ff=128,
        vocab_size=256,
        max_len=128,
        sliding_window=32,
    ),
    "3-mini": _size(32, 3072, 32, 32, 8192, 3_821_079_552),
    "3-medium": _size(40, 5120, 40, 10, 17920, 13_960_238_080),
    "4": _size(
        40,
        5120,
        40,
        10,
        17920,
        14_659_507_200,
        vocab_size=100352,
        max_len=16384,
        rope_theta=250000.0,
        sliding_window=0,
    ),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("phi3.py", PRESETS, arg, PHI3, SOURCE, TRAINING, default="tiny")
