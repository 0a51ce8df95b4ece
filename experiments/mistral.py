"""Mistral 7B (Jiang et al., 2023), as released in its v0.1, v0.2 and v0.3 checkpoints
(MistralForCausalLM).

Llama-style: pre-norm RMSNorm (eps 1e-5), RoPE (theta 1,000,000), SwiGLU, grouped-query
attention (32 query / 8 key-value heads of width 128), no biases, untied unembedding, a 32k-token
context. v0.1 (`7b-v0.1`) has RoPE theta 10,000 and a sliding window: each query sees the 4,096
positions up to its own (model.sliding_window=4096), and decoding keeps a ring of 4,096 cache
slots per layer rather than one per position. Counts are those of the released checkpoints:

| preset  | layers | d_model | heads / kv | d_ff   | vocabulary | parameters    |
|---------|--------|---------|------------|--------|------------|---------------|
| 7b-v0.1 | 32     | 4,096   | 32 / 8     | 14,336 | 32,000     | 7,241,732,096 |
| 7b      | 32     | 4,096   | 32 / 8     | 14,336 | 32,000     | 7,241,732,096 |
| 7b-v0.3 | 32     | 4,096   | 32 / 8     | 14,336 | 32,768     | 7,248,023,552 |

Mixtral, its mixture-of-experts sibling, is experiments/mixtral.py. `tiny` is for tests.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

MISTRAL = dict(
    family="decoder",
    positions="rope",
    rope_theta=1e6,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-5,
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    dropout=0.0,
)
SOURCE = "released Mistral-7B v0.1 / v0.2 / v0.3 checkpoints (MistralForCausalLM)"
SEVEN_B = dict(
    num_layers=32,
    d_model=4096,
    num_heads=32,
    num_kv_heads=8,
    d_ff=14336,
    max_len=32768,
    scan_layers=True,
)

PRESETS = {
    "tiny": dict(
        num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128, vocab_size=256, max_len=128
    ),
    "7b-v0.1": dict(
        SEVEN_B,
        vocab_size=32000,
        rope_theta=1e4,
        sliding_window=4096,
        published_params=7_241_732_096,
    ),
    "7b": dict(SEVEN_B, vocab_size=32000, published_params=7_241_732_096),
    "7b-v0.3": dict(SEVEN_B, vocab_size=32768, published_params=7_248_023_552),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("mistral.py", PRESETS, arg, MISTRAL, SOURCE, TRAINING, default="tiny")
