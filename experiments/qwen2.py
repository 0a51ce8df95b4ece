"""Qwen2 (Yang et al., 2024, "Qwen2 Technical Report") and Qwen2.5 (Qwen team, 2024) decoders,
as released (Qwen2ForCausalLM).

Llama-style: pre-norm RMSNorm (eps 1e-6), RoPE (theta 1e6), SwiGLU, grouped-query attention
with 128-wide heads (64 in the two smallest), no biases except on the query, key and value
projections (model.qkv_bias), a 151,936-row vocabulary (152,064 in the untied 7B and up). The
smaller models tie the unembedding to the embedding. Counts are those of the released
checkpoints:

| preset       | layers | d_model | heads / kv | d_ff   | tied | parameters     |
|--------------|--------|---------|------------|--------|------|----------------|
| 0.5b         | 24     | 896     | 14 / 2     | 4,864  | yes  | 494,032,768    |
| 1.5b         | 28     | 1,536   | 12 / 2     | 8,960  | yes  | 1,543,714,304  |
| 7b           | 28     | 3,584   | 28 / 4     | 18,944 | no   | 7,615,616,512  |
| 72b          | 80     | 8,192   | 64 / 8     | 29,568 | no   | 72,706,203,648 |
| 2.5-3b       | 36     | 2,048   | 16 / 2     | 11,008 | yes  | 3,085,938,688  |
| 2.5-14b      | 48     | 5,120   | 40 / 8     | 13,824 | no   | 14,770,033,664 |
| 2.5-32b      | 64     | 5,120   | 40 / 8     | 27,648 | no   | 32,763,876,352 |

Qwen2.5 0.5B, 1.5B, 7B and 72B have the Qwen2 shapes above. `tiny` is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

QWEN2 = dict(
    family="decoder",
    positions="rope",
    rope_theta=1e6,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-6,
    activation="swiglu",
    use_bias=False,
    qkv_bias=True,
    tie_embeddings=True,
    vocab_size=151936,
    max_len=32768,
    dropout=0.0,
)
SOURCE = "released Qwen2 / Qwen2.5 checkpoints (Qwen2ForCausalLM)"
UNTIED = dict(tie_embeddings=False, vocab_size=152064)


def _size(layers, d_model, heads, kv_heads, d_ff, published, **extra):
  return dict(
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
    "0.5b": _size(24, 896, 14, 2, 4864, 494_032_768),
    "1.5b": _size(28, 1536, 12, 2, 8960, 1_543_714_304),
    "7b": _size(28, 3584, 28, 4, 18944, 7_615_616_512, **UNTIED),
    "72b": _size(80, 8192, 64, 8, 29568, 72_706_203_648, **UNTIED),
    "2.5-3b": _size(36, 2048, 16, 2, 11008, 3_085_938_688),
    "2.5-14b": _size(48, 5120, 40, 8, 13824, 14_770_033_664, **UNTIED),
    "2.5-32b": _size(64, 5120, 40, 8, 27648, 32_763_876_352, **UNTIED),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("qwen2.py", PRESETS, arg, QWEN2, SOURCE, TRAINING, default="tiny")
