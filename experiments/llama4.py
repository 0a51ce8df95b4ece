"""Llama 4 Scout and Maverick (Meta 2025, "The Llama 4 herd"; the Llama-4-Scout-17B-16E and
Llama-4-Maverick-17B-128E model cards), their text models as transformers' Llama4ForCausalLM
builds them: decoders of the one Block.

Pre-norm RMSNorm (eps 1e-5); grouped-query attention, 40 query and 8 key/value heads of 128,
no biases; three of every four blocks chunked (a query sees the keys of its own chunk of 8,192
positions) and rotated by RoPE (theta 500,000; Scout's with Llama 3.1's scaling, factor 16 over
8,192 positions, low and high frequency factors 1), every fourth a global NoPE block
(layer_types chunked,chunked,chunked,nope) whose queries take the attention temperature
1 + 0.1 log(1 + floor((p + 1) / 8,192)) at position p; Scout normalises the RoPE blocks' queries
and keys by their RMS without gains (qk_norm_kind l2, qk_norm_rope_only), Maverick does not. The
mixture of experts: a router picks one expert per token, its weight the sigmoid of the chosen
logit multiplying the token on its way into the expert (moe_scale_input), beside one shared
expert every token passes through, each a SwiGLU of 8,192; Scout's in every block (16 experts),
Maverick's in every second one (blocks 1, 3, ...; 128 experts), its other blocks a dense SwiGLU
of 16,384 (moe_dense_d_ff). Untied 202,048-row embedding and head.

Config values from the released config.json files (text_config of meta-llama/Llama-4-Scout-17B-16E
and meta-llama/Llama-4-Maverick-17B-128E on the Hugging Face hub); counts those of transformers'
Llama4ForCausalLM built from them on the meta device:

| preset   | layers | d_model | heads / kv | experts (shared), top-k | MoE blocks | parameters (active) |
|----------|--------|---------|------------|-------------------------|------------|---------------------|
| tiny     | 4      | 64      | 4 / 2      | 4 (1), 1                | 1, 3       | 0.2M                |
| scout    | 48     | 5,120   | 40 / 8     | 16 (1), 1               | all        | 107,769,861,120 (17.17B) |
| maverick | 48     | 5,120   | 40 / 8     | 128 (1), 1              | 1, 3, ...  | 400,711,848,960 (17.18B) |

Active: per token with one routed expert, the embedding table included. The vision tower and its
projector (Llama4ForConditionalGeneration) are not counted. `tiny` is the test model: every
option at small sizes, a chunk of 8 and a temperature floor of 4 so that short tests reach both.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

LLAMA4 = dict(
    family="decoder",
    positions="rope",
    rope_theta=500000.0,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-5,
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    layer_types="chunked,chunked,chunked,nope",
    attention_chunk=8192,
    attention_temperature_floor=8192,
    attention_temperature_scale=0.1,
    feed_forward="moe",
    moe_impl="ragged",
    top_k=1,
    moe_score="sigmoid",
    router_norm_topk=False,
    moe_scale_input=True,
    num_shared_experts=1,
    dropout=0.0,
)
SOURCE = "transformers' Llama4ForCausalLM built from the released Llama 4 text configs"
RELEASED = dict(
    num_layers=48,
    d_model=5120,
    num_heads=40,
    num_kv_heads=8,
    head_dim=128,
    d_ff=8192,
    moe_dense_d_ff=16384,
    vocab_size=202048,
    scan_layers=True,
)
L2_QK_NORM = dict(qk_norm=True, qk_norm_kind="l2", qk_norm_rope_only=True)

PRESETS = {
    "tiny": dict(
        L2_QK_NORM,
        num_layers=4,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        d_ff=32,
        moe_dense_d_ff=96,
        num_experts=4,
        moe_every=2,
        attention_chunk=8,
        attention_temperature_floor=4,
        rope_scaling="llama3:8,1,4,32",
        vocab_size=256,
        max_len=128,
    ),
    "scout": dict(
        RELEASED,
        **L2_QK_NORM,
        num_experts=16,
        rope_scaling="llama3:16,1,1,8192",
        max_len=10485760,
        published_params=107_769_861_120,
    ),
    "maverick": dict(
        RELEASED,
        num_experts=128,
        moe_every=2,
        max_len=1048576,
        published_params=400_711_848_960,
    ),
}
TRAINING = {
    "tiny": TINY_RUN,
    "scout": dict(batch_size=64, seq_len=8192),
    "maverick": dict(batch_size=64, seq_len=8192),
}


def get_config(arg: str | None = None):
  return preset_config("llama4.py", PRESETS, arg, LLAMA4, SOURCE, TRAINING, default="tiny")
