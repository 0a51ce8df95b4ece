"""Llama 2 (Touvron et al., 2023), Llama 3, 3.1 and 3.2 (Llama team, 2024, "The Llama 3 Herd of
Models") decoders, as released (LlamaForCausalLM).

Pre-norm RMSNorm (eps 1e-5), RoPE, SwiGLU, no biases, untied unembedding (tied in 3.2).
Llama 2: 32,000-token vocabulary, RoPE theta 10,000, grouped-query attention in 70B only.
Llama 3: 128,256 tokens, theta 500,000, 8 key/value heads. Llama 3.1 and 3.2 stretch RoPE with
the "llama3" frequency scaling (model.rope_scaling: factor 8, resp. 32 for 3.2, over an
original context of 8,192) to a 131,072-token context. Counts are those of the released
checkpoints:

| preset | layers | d_model | heads / kv | d_ff   | parameters      |
|--------|--------|---------|------------|--------|-----------------|
| 2-7b   | 32     | 4,096   | 32 / 32    | 11,008 | 6,738,415,616   |
| 2-13b  | 40     | 5,120   | 40 / 40    | 13,824 | 13,015,864,320  |
| 2-70b  | 80     | 8,192   | 64 / 8     | 28,672 | 68,976,648,192  |
| 3-8b   | 32     | 4,096   | 32 / 8     | 14,336 | 8,030,261,248   |
| 3-70b  | 80     | 8,192   | 64 / 8     | 28,672 | 70,553,706,496  |
| 3.1-8b | 32     | 4,096   | 32 / 8     | 14,336 | 8,030,261,248   |
| 3.1-70b| 80     | 8,192   | 64 / 8     | 28,672 | 70,553,706,496  |
| 3.1-405b| 126   | 16,384  | 128 / 8    | 53,248 | 405,853,388,800 |
| 3.2-1b | 16     | 2,048   | 32 / 8 (64 wide) | 8,192 | 1,235,814,400 |
| 3.2-3b | 28     | 3,072   | 24 / 8     | 8,192  | 3,212,749,824   |

`tiny` is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

LLAMA = dict(
    family="decoder",
    positions="rope",
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-5,
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    dropout=0.0,
)
SOURCE = "released Llama 2 / 3 / 3.1 / 3.2 checkpoints (LlamaForCausalLM)"
LLAMA2 = dict(vocab_size=32000, max_len=4096, rope_theta=1e4)
LLAMA3 = dict(vocab_size=128256, max_len=8192, rope_theta=5e5)
LLAMA31 = dict(LLAMA3, max_len=131072, rope_scaling="llama3:8,1,4,8192")
LLAMA32 = dict(LLAMA31, rope_scaling="llama3:32,1,4,8192", tie_embeddings=True)


def _size(layers, d_model, heads, kv_heads, d_ff, published, family, **extra):
  return dict(
      family,
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
        num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128, vocab_size=256, max_len=128
    ),
    "2-7b": _size(32, 4096, 32, 32, 11008, 6_738_415_616, LLAMA2),
    "2-13b": _size(40, 5120, 40, 40, 13824, 13_015_864_320, LLAMA2),
    "2-70b": _size(80, 8192, 64, 8, 28672, 68_976_648_192, LLAMA2),
    "3-8b": _size(32, 4096, 32, 8, 14336, 8_030_261_248, LLAMA3),
    "3-70b": _size(80, 8192, 64, 8, 28672, 70_553_706_496, LLAMA3),
    "3.1-8b": _size(32, 4096, 32, 8, 14336, 8_030_261_248, LLAMA31),
    "3.1-70b": _size(80, 8192, 64, 8, 28672, 70_553_706_496, LLAMA31),
    "3.1-405b": _size(126, 16384, 128, 8, 53248, 405_853_388_800, LLAMA31),
    "3.2-1b": _size(16, 2048, 32, 8, 8192, 1_235_814_400, LLAMA32, head_dim=64),
    "3.2-3b": _size(28, 3072, 24, 8, 8192, 3_212_749_824, LLAMA32),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("llama.py", PRESETS, arg, LLAMA, SOURCE, TRAINING, default="tiny")
