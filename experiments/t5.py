"""T5 (Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer") and T5 v1.1, as released.

Encoder-decoder, pre-norm RMSNorm without bias, no biases anywhere, no position embeddings: each
stack has one relative-position bias table (model.positions=t5: 32 buckets up to distance 128,
bidirectional in the encoder, causal in the decoder) shared by its layers; attention scores are
not divided by sqrt(head_dim) (T5 folds that into its initialisation); one 32,128-row vocabulary
shared by both stacks.

T5 (v1.0): ReLU feed-forward, the unembedding tied to the embedding and reading the decoder
output scaled by d_model^-1/2. T5 v1.1: gated-GELU (tanh) feed-forward and an untied
unembedding. Counts are those of the released checkpoints (T5ForConditionalGeneration; the tied
table counted once):

| preset    | layers (enc+dec) | d_model | heads x width | d_ff   | parameters     |
|-----------|------------------|---------|---------------|--------|----------------|
| small     | 6 + 6            | 512     | 8 x 64        | 2,048  | 60,506,624     |
| base      | 12 + 12          | 768     | 12 x 64       | 3,072  | 222,903,552    |
| large     | 24 + 24          | 1,024   | 16 x 64       | 4,096  | 737,668,096    |
| 3b        | 24 + 24          | 1,024   | 32 x 128      | 16,384 | 2,851,598,336  |
| 11b       | 24 + 24          | 1,024   | 128 x 128     | 65,536 | 11,307,321,344 |
| v1_1-small| 8 + 8            | 512     | 6 x 64        | 1,024  | 76,961,152     |
| v1_1-base | 12 + 12          | 768     | 12 x 64       | 2,048  | 247,577,856    |
| v1_1-large| 24 + 24          | 1,024   | 16 x 64       | 2,816  | 783,150,080    |
| v1_1-xl   | 24 + 24          | 2,048   | 32 x 64       | 5,120  | 2,849,757,184  |
| v1_1-xxl  | 24 + 24          | 4,096   | 64 x 64       | 10,240 | 11,135,332,352 |

`tiny` (2 + 2 x 64, byte vocabulary) is for tests and CPU runs.
"""

from transformers_jax.train_config import preset_config

T5 = dict(
    family="encoder_decoder",
    vocab_size=32128,
    max_len=512,
    positions="t5",
    relative_buckets=32,
    relative_max_distance=128,
    norm_placement="pre",
    norm="rmsnorm",
    norm_eps=1e-6,
    activation="relu",
    use_bias=False,
    scale_scores=False,
    tie_embeddings=True,
    unembed_scale=True,
    share_embeddings=True,
    dropout=0.1,
)
V1_1 = dict(activation="geglu_tanh", tie_embeddings=False, unembed_scale=False, dropout=0.0)
SOURCE = "released T5 / T5 v1.1 checkpoints (Raffel et al. 2020), T5ForConditionalGeneration"


def _size(layers, d_model, heads, head_dim, d_ff, published, **extra):
  return dict(
      num_layers=layers,
      d_model=d_model,
      num_heads=heads,
      head_dim=head_dim,
      d_ff=d_ff,
      scan_layers=True,
      published_params=published,
      **extra,
  )


PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, d_ff=128, vocab_size=260, max_len=64),
    "small": _size(6, 512, 8, 64, 2048, 60_506_624),
    "base": _size(12, 768, 12, 64, 3072, 222_903_552),
    "large": _size(24, 1024, 16, 64, 4096, 737_668_096),
    "3b": _size(24, 1024, 32, 128, 16384, 2_851_598_336),
    "11b": _size(24, 1024, 128, 128, 65536, 11_307_321_344),
    "v1_1-small": _size(8, 512, 6, 64, 1024, 76_961_152, **V1_1),
    "v1_1-base": _size(12, 768, 12, 64, 2048, 247_577_856, **V1_1),
    "v1_1-large": _size(24, 1024, 16, 64, 2816, 783_150_080, **V1_1),
    "v1_1-xl": _size(24, 2048, 32, 64, 5120, 2_849_757_184, **V1_1),
    "v1_1-xxl": _size(24, 4096, 64, 64, 10240, 11_135_332_352, **V1_1),
}

# Training fields per preset (the rest as in transformers_jax/train_config.py).
TRAINING = {
    "tiny": dict(
        steps=400,
        batch_size=32,
        seq_len=64,
        learning_rate=2e-3,
        warmup_steps=40,
        log_every=40,
        eval_every=200,
        checkpoint_every=200,
        data=dict(max_number=99_999),
    ),
}


def get_config(arg: str | None = None):
  return preset_config("t5.py", PRESETS, arg, T5, SOURCE, TRAINING, default="tiny")
