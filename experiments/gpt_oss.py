"""gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"), as released
(GptOssForCausalLM).

Pre-norm RMSNorm (eps 1e-5); grouped-query attention, 64 query and 8 key/value heads of 64,
with biases on q, k, v and the output and a learned sink logit per head in every softmax
(model.attention_sinks); every other block (0, 2, ...) attends a banded window of the last 128
tokens, the others every earlier token (sliding_window=128, sliding_every=2, as the configs'
layer_types say); RoPE with theta 150,000 under YaRN scaling (factor 32 over an original
context of 4,096, betas 32 and 1, not truncated: rope_scaling yarn:32,32,1,4096,0); a mixture
of experts in every block, 4 routed per token by a router with a bias (model.router_bias), the
softmax over the 4 chosen logits (the renormalised top-4 probabilities, the same numbers), each
expert a clamped SwiGLU of width 2,880 with biases (activation swiglu_clamped: alpha 1.702,
limit 7, (up + 1)); untied 201,088-row embedding and unembedding. Config values from the
released config.json files (openai/gpt-oss-20b and openai/gpt-oss-120b on the Hugging Face
hub); counts those of transformers' GptOssForCausalLM built from them (the meta device):

| preset | layers | d_model | heads / kv | experts, top-k | expert d_ff | parameters (active) |
|--------|--------|---------|------------|----------------|-------------|---------------------|
| tiny   | 2      | 64      | 4 / 2      | 4, 2           | 64          | 0.16M               |
| cpu    | 4      | 128     | 4 / 2      | 8, 2           | 128         | 1.9M                |
| 20b    | 24     | 2,880   | 64 / 8     | 32, 4          | 2,880       | 20,914,757,184 (4.19B) |
| 120b   | 36     | 2,880   | 64 / 8     | 128, 4         | 2,880       | 116,829,156,672 (5.71B) |

Active: per token, the embedding table included; without it (a lookup, 579M), 3.61B and
5.13B, the model card's figures.

The released weights store the experts in MXFP4, which `convert --from_hf` reads into floating
point (docs/interop.md). `tiny` is the test model, `cpu` trains on a CPU.
"""

from transformers_jax.train_config import CPU_RUN, TINY_RUN, preset_config

GPT_OSS = dict(
    family="decoder",
    positions="rope",
    rope_theta=150000.0,
    rope_scaling="yarn:32,32,1,4096,0",
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-5,
    use_bias=True,  # q, k, v and out; the experts' gate, up and down
    attention_sinks=True,
    sliding_window=128,
    sliding_every=2,
    activation="swiglu_clamped",
    glu_alpha=1.702,
    glu_limit=7.0,
    feed_forward="moe",
    moe_impl="ragged",
    router_bias=True,
    top_k=4,
    tie_embeddings=False,
    dropout=0.0,
)
SOURCE = "transformers' GptOssForCausalLM built from the released gpt-oss config.json files"
RELEASED = dict(
    d_model=2880,
    num_heads=64,
    num_kv_heads=8,
    head_dim=64,
    d_ff=2880,
    vocab_size=201088,
    max_len=131072,
    scan_layers=True,
)

PRESETS = {
    "tiny": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        d_ff=64,
        num_experts=4,
        top_k=2,
        sliding_window=16,
        vocab_size=256,
        max_len=128,
    ),
    "cpu": dict(
        num_layers=4,
        d_model=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        d_ff=128,
        num_experts=8,
        top_k=2,
        sliding_window=64,
        vocab_size=256,
        max_len=256,
    ),
    "20b": dict(RELEASED, num_layers=24, num_experts=32, published_params=20_914_757_184),
    "120b": dict(RELEASED, num_layers=36, num_experts=128, published_params=116_829_156_672),
}

TRAINING = {
    "tiny": TINY_RUN,
    "cpu": CPU_RUN,
    "20b": dict(batch_size=64, seq_len=4096),
    "120b": dict(batch_size=64, seq_len=4096),
}


def get_config(arg: str | None = None):
  return preset_config("gpt_oss.py", PRESETS, arg, GPT_OSS, SOURCE, TRAINING, default="tiny")
