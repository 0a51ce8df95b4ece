"""Qwen3 (Qwen team, 2025, "Qwen3 Technical Report") dense decoders, as released
(Qwen3ForCausalLM; config values from the Hugging Face configs Qwen/Qwen3-0.6B, -1.7B, -4B,
-8B, -14B, -32B).

Qwen2.5's blocks (pre-norm RMSNorm, eps 1e-6; RoPE at theta 1,000,000; SwiGLU; grouped-query
attention with 8 key/value heads) without the q/k/v biases, and with an RMSNorm over each
head's queries and keys (model.qk_norm, qk_norm_kind=head: 128 + 128 parameters per layer).
Every head is 128 wide, whatever d_model / heads is (model.head_dim=128). A 151,936-token
vocabulary, the unembedding tied in 0.6B, 1.7B and 4B. Counts are those of the released
checkpoints: transformers' Qwen3ForCausalLM built from each config on the meta device, the
tied table counted once:

| preset | layers | d_model | heads / kv | d_ff   | tied | parameters     |
|--------|--------|---------|------------|--------|------|----------------|
| 0.6b   | 28     | 1,024   | 16 / 8     | 3,072  | yes  | 596,049,920    |
| 1.7b   | 28     | 2,048   | 16 / 8     | 6,144  | yes  | 1,720,574,976  |
| 4b     | 36     | 2,560   | 32 / 8     | 9,728  | yes  | 4,022,468,096  |
| 8b     | 36     | 4,096   | 32 / 8     | 12,288 | no   | 8,190,735,360  |
| 14b    | 40     | 5,120   | 40 / 8     | 17,408 | no   | 14,768,307,200 |
| 32b    | 64     | 5,120   | 64 / 8     | 25,600 | no   | 32,762,123,264 |

The configs' context is 40,960 positions (max_len); their sliding window is off
(use_sliding_window: false). `tiny` is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

QWEN3 = dict(
    family="decoder",
    positions="rope",
    rope_theta=1e6,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-6,
    qk_norm=True,
    qk_norm_kind="head",
    activation="swiglu",
    use_bias=False,
    head_dim=128,
    tie_embeddings=True,
    vocab_size=151936,
    max_len=40960,
    dropout=0.0,
)
SOURCE = "released Qwen3 checkpoints (Qwen3ForCausalLM; Hugging Face configs Qwen/Qwen3-*)"


def _size(layers, d_model, heads, d_ff, published, tied=True):
  return dict(
      num_layers=layers,
      d_model=d_model,
      num_heads=heads,
      num_kv_heads=8,
      d_ff=d_ff,
      tie_embeddings=tied,
      scan_layers=True,
      published_params=published,
  )


PRESETS = {
    "tiny": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        d_ff=128,
        vocab_size=256,
        max_len=128,
    ),
    "0.6b": _size(28, 1024, 16, 3072, 596_049_920),
    "1.7b": _size(28, 2048, 16, 6144, 1_720_574_976),
    "4b": _size(36, 2560, 32, 9728, 4_022_468_096),
    "8b": _size(36, 4096, 32, 12288, 8_190_735_360, tied=False),
    "14b": _size(40, 5120, 40, 17408, 14_768_307_200, tied=False),
    "32b": _size(64, 5120, 64, 25600, 32_762_123_264, tied=False),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("qwen3.py", PRESETS, arg, QWEN3, SOURCE, TRAINING, default="tiny")
