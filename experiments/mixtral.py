"""Mixtral-shaped sparse mixtures of experts (Jiang et al., 2024): a Mistral-7B decoder whose
feed-forward is 8 SwiGLU experts, 2 routed per token.

| preset | layers | d_model | heads / kv | d_ff  | experts, top-k | parameters (active) |
|--------|--------|---------|------------|-------|----------------|---------------------|
| tiny   | 2      | 64      | 4 / 2      | 128   | 4, 2           | 0.25M               |
| cpu    | 4      | 128     | 4 / 2      | 256   | 8, 2           | 3.4M (1.1M)         |
| 8x7b   | 32     | 4,096   | 32 / 8     | 14,336| 8, 2           | 46.7B (12.9B)       |
| 8x22b  | 56     | 6,144   | 48 / 8     | 16,384| 8, 2           | 140.6B (39.2B)      |

8x7b: RMSNorm, RoPE (theta 1e6), grouped-query attention with 128-wide heads, untied 32,000-row
embedding and unembedding, no biases; 46,702,792,704 parameters as published for the released
checkpoint; 8x22b: the same design at 56 layers of 6,144,
140,620,634,112 parameters as released (Mistral AI, 2024). Layers are scanned (one compiled body). The routing implementation is
`model.moe_impl` (docs/moe.md): `ragged` (dropless, grouped matmuls) in these presets.
`tiny` is the test model; `cpu` trains on a laptop CPU in minutes.
"""

from transformers_jax.train_config import TINY_RUN, CPU_RUN, preset_config

MIXTRAL = dict(
    family="decoder",
    positions="rope",
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-5,
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    feed_forward="moe",
    moe_impl="ragged",
    num_experts=8,
    top_k=2,
    dropout=0.0,
)
SOURCE = "released Mixtral 8x7B and 8x22B checkpoints (Jiang et al. 2024; Mistral AI 2024)"

PRESETS = {
    "tiny": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        d_ff=128,
        num_experts=4,
        vocab_size=256,
        max_len=128,
    ),
    "cpu": dict(
        num_layers=4,
        d_model=128,
        num_heads=4,
        num_kv_heads=2,
        d_ff=256,
        vocab_size=256,
        max_len=256,
    ),
    "8x7b": dict(
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        d_ff=14336,
        vocab_size=32000,
        max_len=32768,
        rope_theta=1e6,
        scan_layers=True,
        published_params=46_702_792_704,
    ),
    "8x22b": dict(
        num_layers=56,
        d_model=6144,
        num_heads=48,
        num_kv_heads=8,
        head_dim=128,
        d_ff=16384,
        vocab_size=32000,
        max_len=65536,
        rope_theta=1e6,
        scan_layers=True,
        published_params=140_620_634_112,
    ),
}

# Training fields per preset (the rest as in transformers_jax/train_config.py).
TRAINING = {
    "tiny": TINY_RUN,
    "cpu": CPU_RUN,
    "8x7b": dict(batch_size=64, seq_len=4096),
    "8x22b": dict(batch_size=64, seq_len=4096),
}


def get_config(arg: str | None = None):
  return preset_config("mixtral.py", PRESETS, arg, MIXTRAL, SOURCE, TRAINING, default="tiny")
