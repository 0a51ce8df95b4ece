"""Gemma (Gemma team, 2024, "Gemma: Open Models Based on Gemini Research and Technology") and
Gemma 2 (Gemma team, 2024, "Gemma 2: Improving Open Language Models at a Practical Size"), as
released (GemmaForCausalLM, Gemma2ForCausalLM).

Pre-norm RMSNorm (eps 1e-6) whose weights are stored as w and applied as 1 + w
(model.norm_unit_offset), RoPE (theta 10,000), gated tanh-GELU feed-forward (geglu_tanh),
256-wide heads (multi-query attention in 2B), no biases, a 256,000-token vocabulary whose
embedding is scaled by sqrt(d_model) and tied to the unembedding. Counts are those of the
released checkpoints:

| preset | layers | d_model | heads / kv | d_ff   | parameters    |
|--------|--------|---------|------------|--------|---------------|
| 2b     | 18     | 2,048   | 8 / 1      | 16,384 | 2,506,172,416 |
| 7b     | 28     | 3,072   | 16 / 16    | 24,576 | 8,537,680,896 |
| 2-2b   | 26     | 2,304   | 8 / 4      | 9,216  | 2,614,341,888 |
| 2-9b   | 42     | 3,584   | 16 / 8     | 14,336 | 9,241,705,984 |
| 2-27b  | 46     | 4,608   | 32 / 16    | 36,864 | 27,227,128,320 |

Gemma 2 puts a norm before and after each sublayer (norm_placement=sandwich), soft-caps the
attention scores at 50 and the output logits at 30, and slides a 4,096-token window over every
other block (the first included); its heads are 256 wide, 128 in 27B. 27B scales its scores by
1/sqrt(144) (d_model / heads), not 1/sqrt(128) (model.score_scale_width=144). `tiny` is for
tests and CPU runs.
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
SOURCE = "released Gemma 2B / 7B and Gemma 2 2B / 9B / 27B checkpoints"
GEMMA2 = dict(
    norm_placement="sandwich",
    attention_softcap=50.0,
    logit_softcap=30.0,
    sliding_window=4096,
    sliding_every=2,
)


def _gemma2(layers, d_model, heads, kv_heads, head_dim, d_ff, published):
  return dict(
      num_layers=layers,
      d_model=d_model,
      num_heads=heads,
      num_kv_heads=kv_heads,
      head_dim=head_dim,
      d_ff=d_ff,
      scan_layers=True,
      published_params=published,
  )


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
    "2-2b": dict(GEMMA2, **_gemma2(26, 2304, 8, 4, 256, 9216, 2_614_341_888)),
    "2-9b": dict(GEMMA2, **_gemma2(42, 3584, 16, 8, 256, 14336, 9_241_705_984)),
    "2-27b": dict(
        GEMMA2, score_scale_width=144, **_gemma2(46, 4608, 32, 16, 128, 36864, 27_227_128_320)
    ),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("gemma.py", PRESETS, arg, GEMMA, SOURCE, TRAINING, default="tiny")
