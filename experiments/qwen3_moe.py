"""Qwen3's mixtures of experts (Qwen team 2025, "Qwen3 Technical Report"), as released
(Qwen3MoeForCausalLM).

Pre-norm RMSNorm (eps 1e-6); grouped-query attention with 128-wide heads, no biases, and a
per-head RMSNorm of the queries and of the keys over head_dim before RoPE (model.qk_norm with
norm=rmsnorm, one scale of 128 each, shared by the heads); RoPE theta 1e6; every block a
mixture of 128 SwiGLU experts, 8 routed per token, the 8 chosen softmax probabilities
renormalised to sum to one (norm_topk_prob: true, model.router_norm_topk); no shared expert,
no dense blocks (decoder_sparse_step 1, mlp_only_layers empty); untied 151,936-row embedding
and unembedding. Config values from the released config.json files (Qwen/Qwen3-30B-A3B and
Qwen/Qwen3-235B-A22B on the Hugging Face hub); counts those of transformers'
Qwen3MoeForCausalLM built from them (the meta device):

| preset    | layers | d_model | heads / kv | experts, top-k | expert d_ff | parameters (active) |
|-----------|--------|---------|------------|----------------|-------------|---------------------|
| tiny      | 2      | 64      | 4 / 2      | 8, 2           | 32          | 0.18M               |
| 30b-a3b   | 48     | 2,048   | 32 / 4     | 128, 8         | 768         | 30,532,122,624 (3.35B) |
| 235b-a22b | 94     | 4,096   | 64 / 4     | 128, 8         | 1,536       | 235,093,634,560 (22.2B) |

`tiny` is the test model.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

QWEN3_MOE = dict(
    family="decoder",
    positions="rope",
    rope_theta=1e6,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-6,
    qk_norm=True,
    activation="swiglu",
    use_bias=False,
    feed_forward="moe",
    moe_impl="ragged",
    router_norm_topk=True,
    num_experts=128,
    top_k=8,
    tie_embeddings=False,
    vocab_size=151936,
    max_len=40960,
    dropout=0.0,
)
SOURCE = "transformers' Qwen3MoeForCausalLM built from the released Qwen3 MoE config.json files"

PRESETS = {
    "tiny": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        d_ff=32,
        num_experts=8,
        top_k=2,
        vocab_size=256,
        max_len=128,
    ),
    "30b-a3b": dict(
        num_layers=48,
        d_model=2048,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        d_ff=768,
        scan_layers=True,
        published_params=30_532_122_624,
    ),
    "235b-a22b": dict(
        num_layers=94,
        d_model=4096,
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        d_ff=1536,
        scan_layers=True,
        published_params=235_093_634_560,
    ),
}

TRAINING = {
    "tiny": TINY_RUN,
    "30b-a3b": dict(batch_size=64, seq_len=4096),
    "235b-a22b": dict(batch_size=64, seq_len=4096),
}


def get_config(arg: str | None = None):
  return preset_config("qwen3_moe.py", PRESETS, arg, QWEN3_MOE, SOURCE, TRAINING, default="tiny")
