"""DeepSeek-V3 (DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report") and DeepSeek-V2-Lite
(DeepSeek-AI, 2024, "DeepSeek-V2"): decoders of the one Block with multi-head latent attention
(modules/mla.py) and DeepSeek's mixture of experts (modules/moe_routing.py).

| preset     | layers | d_model | heads | latents q / kv | experts (shared), top-k | parameters |
|------------|--------|---------|-------|----------------|-------------------------|------------|
| tiny       | 3      | 64      | 4     | 32 / 24        | 8 (1), 2 of 2 groups    | 0.3M       |
| v2-lite    | 27     | 2,048   | 16    | - / 512        | 64 (2), 6               | 15.7B      |
| v3         | 61     | 7,168   | 128   | 1,536 / 512    | 256 (1), 8 of 4 groups  | 671.0B     |
| v3-mtp     | 61 + 1 | 7,168   | 128   | 1,536 / 512    | 256 (1), 8 of 4 groups  | 682.6B     |

V3: pre-norm RMSNorm (eps 1e-6), 128 heads with 128 + 64 query/key features (the 64 rotated
ones decoupled, one key for every head) and 128 value features, keys and values from one
512-wide latent per token, queries from a 1,536-wide one; YaRN RoPE (factor 40 over 4,096
positions, to 163,840); the first 3 blocks dense (SwiGLU of 18,432), the other 58 an MoE of
256 routed SwiGLU experts of 2,048 (8 per token, by sigmoid scores plus the
auxiliary-loss-free bias, within 4 of 8 groups, their weights renormalised and times 2.5)
beside 1 shared expert; untied 129,280-token embedding and head. The counts are transformers'
DeepseekV3ForCausalLM's parameters on the meta device: 671,026,404,352 (the routers' 14,848 bias
values are state, counted apart), and 682,636,472,320 with the multi-token prediction module
(v3-mtp, model.mtp_depth=1: one more MoE block, its norms and 2D x D projection; embedding and
head shared; the hub's file holds its own copies of both, 684,489,830,400 values), which
v3-mtp trains with task=mtp (lambda 0.3). Training fields follow the report: sequences of
4,096 tokens, AdamW (0.9, 0.95, weight decay 0.1), peak learning rate 2.2e-4, the
sequence-wise balance loss at alpha 1e-4 and the bias update speed 0.001.

V2-Lite: 27 blocks of 2,048, 16 heads, queries projected directly, the first block dense
(10,944), then 64 routed experts of 1,408 (6 per token by softmax scores, not renormalised)
beside 2 shared ones; 15,706,484,224 parameters (transformers' DeepseekV2ForCausalLM). `tiny`
is the test model: every option of both at small sizes.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

DEEPSEEK = dict(
    family="decoder",
    positions="rope",
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-6,
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    feed_forward="moe",
    moe_impl="ragged",
    moe_dropless=True,
    dropout=0.0,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    kv_lora_rank=512,
)
SOURCE = "transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM with the released configs"
V3 = dict(
    num_layers=61,
    d_model=7168,
    num_heads=128,
    q_lora_rank=1536,
    num_experts=256,
    d_ff=2048,
    num_shared_experts=1,
    top_k=8,
    moe_groups=8,
    moe_top_groups=4,
    moe_first_dense=3,
    moe_dense_d_ff=18432,
    moe_score="sigmoid",
    moe_score_bias=True,
    moe_routed_scale=2.5,
    vocab_size=129280,
    max_len=163840,
    rope_scaling="yarn:40,32,1,4096,1,1,1",
    scan_layers=True,
)

PRESETS = {
    "tiny": dict(
        num_layers=3,
        d_model=64,
        num_heads=4,
        q_lora_rank=32,
        kv_lora_rank=24,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        num_experts=8,
        d_ff=32,
        num_shared_experts=1,
        top_k=2,
        moe_groups=2,
        moe_top_groups=1,
        moe_first_dense=1,
        moe_dense_d_ff=128,
        moe_score="sigmoid",
        moe_score_bias=True,
        moe_routed_scale=2.5,
        vocab_size=256,
        max_len=128,
        rope_scaling="yarn:4,32,1,32,1,1,1",
        mtp_depth=1,
    ),
    "v2-lite": dict(
        num_layers=27,
        d_model=2048,
        num_heads=16,
        num_experts=64,
        d_ff=1408,
        num_shared_experts=2,
        top_k=6,
        moe_first_dense=1,
        moe_dense_d_ff=10944,
        router_norm_topk=False,
        vocab_size=102400,
        max_len=163840,
        scan_layers=True,
        published_params=15_706_484_224,
    ),
    "v3": dict(V3, published_params=671_026_404_352),
    "v3-mtp": dict(V3, mtp_depth=1, published_params=682_636_472_320),
}

V3_RUN = dict(
    batch_size=15360,
    seq_len=4096,
    learning_rate=2.2e-4,
    weight_decay=0.1,
    adam_b2=0.95,
    moe_aux_weight=1e-4,
)
TRAINING = {
    "tiny": dict(TINY_RUN, task="mtp"),
    "v3": V3_RUN,
    "v3-mtp": dict(V3_RUN, task="mtp"),
}


def get_config(arg: str | None = None):
  return preset_config("deepseek.py", PRESETS, arg, DEEPSEEK, SOURCE, TRAINING, default="tiny")
