"""Gemma 3 (Gemma team, 2025, "Gemma 3 Technical Report") text models, as released
(Gemma3ForCausalLM; config values from the Hugging Face configs google/gemma-3-1b-pt and the
text_config of google/gemma-3-4b-pt, -12b-pt, -27b-pt).

Gemma 2's blocks (interop/gemma.py: a norm before and after each sublayer, RMSNorm weights
applied as 1 + w, eps 1e-6, tanh-GeGLU, embeddings times sqrt(d_model), a tied unembedding,
256-wide heads, 128 in 27B) with Gemma 3's changes: an RMSNorm over each head's queries and
keys (model.qk_norm, also 1 + w), no soft-capping, and five sliding-window layers to each full
one (model.layer_types, from the first layer: sliding x 5, full), the sliding layers' window
512 positions in 1B and 1,024 above, their RoPE at base 10,000 (model.rope_local_theta), the
full layers' at 1,000,000 with linear scaling by 8 in 4B and up (model.rope_scaling=linear:8).
Scores are divided by sqrt(query_pre_attn_scalar): 256, the head width, and 168 (= d_model /
heads) in 27B (model.score_scale_width).

Counts are transformers' Gemma3ForCausalLM built from each (text) config on the meta device,
the tied table counted once. 4B, 12B and 27B are multimodal checkpoints
(Gemma3ForConditionalGeneration): the figures are their text model alone (the decoder and its
tied embedding, whose 262,208 rows include the image tokens), without the SigLIP vision tower
(about 417M parameters) and the projector into the text width (1,152 x d_model + 1,152).

| preset | layers | d_model | heads / kv | d_ff   | window | parameters     |
|--------|--------|---------|------------|--------|--------|----------------|
| 1b     | 26     | 1,152   | 4 / 1      | 6,912  | 512    | 999,885,952    |
| 4b     | 34     | 2,560   | 8 / 4      | 10,240 | 1,024  | 3,880,263,168  |
| 12b    | 48     | 3,840   | 16 / 8     | 15,360 | 1,024  | 11,766,034,176 |
| 27b    | 62     | 5,376   | 32 / 16    | 21,504 | 1,024  | 27,009,346,304 |

`tiny` is for tests and CPU runs (two sliding layers and a full one).
"""

from transformers_jax.train_config import TINY_RUN, preset_config

GEMMA3 = dict(
    family="decoder",
    positions="rope",
    rope_theta=1e6,
    rope_local_theta=1e4,
    norm_placement="sandwich",
    norm="rmsnorm",
    norm_eps=1e-6,
    norm_unit_offset=True,
    qk_norm=True,
    qk_norm_kind="head",
    activation="geglu_tanh",
    use_bias=False,
    embed_scale=True,
    tie_embeddings=True,
    head_dim=256,
    layer_types="sliding,sliding,sliding,sliding,sliding,full",
    sliding_window=1024,
    rope_scaling="linear:8",
    vocab_size=262208,
    max_len=131072,
    dropout=0.0,
)
SOURCE = "released Gemma 3 checkpoints' text models (Gemma3ForCausalLM; google/gemma-3-*-pt)"


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
        num_layers=3,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        d_ff=128,
        vocab_size=256,
        max_len=128,
        layer_types="sliding,sliding,full",
        sliding_window=32,
    ),
    "1b": _size(
        26,
        1152,
        4,
        1,
        6912,
        999_885_952,
        vocab_size=262144,
        max_len=32768,
        sliding_window=512,
        rope_scaling="",
    ),
    "4b": _size(34, 2560, 8, 4, 10240, 3_880_263_168),
    "12b": _size(48, 3840, 16, 8, 15360, 11_766_034_176),
    "27b": _size(62, 5376, 32, 16, 21504, 27_009_346_304, head_dim=128, score_scale_width=168),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("gemma3.py", PRESETS, arg, GEMMA3, SOURCE, TRAINING, default="tiny")
