"""Gemma (Gemma team, 2024, "Gemma: Open Models Based on Gemini Research and Technology"), as
released (GemmaForCausalLM).

Pre-norm RMSNorm (eps 1e-6) whose weights are stored as w and applied as 1 + w
(model.norm_unit_offset), RoPE (theta 10,000), gated tanh-GELU feed-forward (geglu_tanh),
256-wide heads (multi-query attention in 2B), no biases, a 256,000-token vocabulary whose
embedding is scaled by sqrt(d_model) and tied to the unembedding. Counts are those of the
released checkpoints:

| preset | layers | d_model | heads / kv | d_ff   | parameters    |
|--------|--------|---------|------------|--------|---------------|
| 2b     | 18     | 2,048   | 8 / 1      | 16,384 | 2,506,172,416 |
| 7b     | 28     | 3,072   | 16 / 16    | 24,576 | 8,537,680,896 |

Gemma 2 adds attention and final-logit soft-capping, alternating sliding-window layers and
norms after each sublayer: not among these presets yet. `tiny` is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

GEMMA = dict(
    family="decoder",
    positions="rope",
    rope_theta=1e4,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-6,
    norm_unit_offset=True,
    activation="geglu_tanh",
    use_bias=False,
    embed_scale=True,
    tie_embeddings=True,
    vocab_size=256000,
    max_len=8192,
    dropout=0.0,
)
SOURCE = "released Gemma 2B / 7B checkpoints (GemmaForCausalLM)"

PRESETS = {
    "tiny": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        d_ff=128,
        vocab_size=256,
        max_len=128,
    ),
    "2b": dict(
        num_layers=18,
        d_model=2048,
        num_heads=8,
        num_kv_heads=1,
        head_dim=256,
        d_ff=16384,
        scan_layers=True,
        published_params=2_506_172_416,
    ),
    "7b": dict(
        num_layers=28,
        d_model=3072,
        num_heads=16,
        num_kv_heads=16,
        head_dim=256,
        d_ff=24576,
        scan_layers=True,
        published_params=8_537_680_896,
    ),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("gemma.py", PRESETS, arg, GEMMA, SOURCE, TRAINING, default="tiny")
