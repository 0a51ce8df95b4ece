"""SmolLM3 (Hugging Face, 2025, "SmolLM3: smol, multilingual, long-context reasoner"), as
released (SmolLM3ForCausalLM; config values from the Hugging Face config
HuggingFaceTB/SmolLM3-3B).

Llama's blocks (pre-norm RMSNorm, eps 1e-6; SwiGLU; grouped-query attention, 16 query heads
over 4 key/value heads; no biases) with RoPE left out of every fourth layer (NoPE: config's
no_rope_layer_interval 4, model.layer_types=full,full,full,nope), RoPE at theta 5,000,000
elsewhere, a 128,256-token vocabulary tied to the unembedding and a context of 65,536
positions. The count is transformers' SmolLM3ForCausalLM built from the config on the meta
device, the tied table counted once:

| preset | layers | d_model | heads / kv | d_ff   | parameters    |
|--------|--------|---------|------------|--------|---------------|
| 3b     | 36     | 2,048   | 16 / 4     | 11,008 | 3,075,098,624 |

`tiny` is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

SMOLLM3 = dict(
    family="decoder",
    positions="rope",
    rope_theta=5e6,
    layer_types="full,full,full,nope",
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-6,
    activation="swiglu",
    use_bias=False,
    tie_embeddings=True,
    vocab_size=128256,
    max_len=65536,
    dropout=0.0,
)
SOURCE = "released SmolLM3-3B checkpoint (SmolLM3ForCausalLM; HuggingFaceTB/SmolLM3-3B)"

PRESETS = {
    "tiny": dict(
        num_layers=4, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128, vocab_size=256, max_len=128
    ),
    "3b": dict(
        num_layers=36,
        d_model=2048,
        num_heads=16,
        num_kv_heads=4,
        d_ff=11008,
        scan_layers=True,
        published_params=3_075_098_624,
    ),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("smollm3.py", PRESETS, arg, SMOLLM3, SOURCE, TRAINING, default="tiny")
