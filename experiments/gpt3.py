"""GPT-3 (Brown et al., 2020, Table 2.1): GPT-2's architecture at eight sizes, context 2,048.

| preset | layers | d_model | heads | head dim | nominal |
|--------|--------|---------|-------|----------|---------|
| small  | 12     | 768     | 12    | 64       | 125M    |
| medium | 24     | 1024    | 16    | 64       | 350M    |
| large  | 24     | 1536    | 16    | 96       | 760M    |
| xl     | 24     | 2048    | 16*   | 128      | 1.3B    |
| 2.7b   | 32     | 2560    | 32    | 80       | 2.7B    |
| 6.7b   | 32     | 4096    | 32    | 128      | 6.7B    |
| 13b    | 40     | 5140    | 40    | 128      | 13B     |
| 175b   | 96     | 12288   | 96    | 128      | 175B    |

d_ff = 4 * d_model, vocabulary 50,257, tied unembedding. Two places where the table does not
multiply out: XL lists 24 heads of 128 (3,072 != 2,048; that would give 1.52B, not 1.3B), so
this preset uses 16 heads of 128; 13B lists d_model 5,140 with 40 heads of 128, kept as written
through `head_dim=128` (attention width 5,120 inside a 5,140-wide stream). The paper's alternating
locally banded sparse attention is not modelled: every layer is dense. The embedding table holds
50,304 rows (`vocab_multiple=128`, as Megatron pads it) so the vocabulary splits over up to 128
tensor-parallel chips; counts and conversions see the 50,257 real ones. Layers are scanned so
that counting 175B with eval_shape takes seconds.
"""

from transformers_jax.train_config import preset_config

GPT3 = dict(
    family="decoder",
    vocab_size=50257,
    max_len=2048,
    positions="learned",
    norm_placement="pre",
    norm="layernorm",
    norm_eps=1e-5,
    activation="gelu_tanh",
    tie_embeddings=True,
    use_bias=True,
    scan_layers=True,
    vocab_multiple=128,
)
SOURCE = "GPT-3 paper, Table 2.1 (nominal size)"

PRESETS = {
    "small": dict(num_layers=12, d_model=768, num_heads=12, published_params=125_000_000),
    "medium": dict(num_layers=24, d_model=1024, num_heads=16, published_params=350_000_000),
    "large": dict(num_layers=24, d_model=1536, num_heads=16, published_params=760_000_000),
    "xl": dict(num_layers=24, d_model=2048, num_heads=16, published_params=1_300_000_000),
    "2.7b": dict(num_layers=32, d_model=2560, num_heads=32, published_params=2_700_000_000),
    "6.7b": dict(num_layers=32, d_model=4096, num_heads=32, published_params=6_700_000_000),
    "13b": dict(
        num_layers=40, d_model=5140, num_heads=40, head_dim=128, published_params=13_000_000_000
    ),
    "175b": dict(num_layers=96, d_model=12288, num_heads=96, published_params=175_000_000_000),
}

# Training fields per preset (the rest as in transformers_jax/train_config.py).
TRAINING = {}


def get_config(arg: str | None = None):
  return preset_config("gpt3.py", PRESETS, arg, GPT3, SOURCE, TRAINING, default="small")
