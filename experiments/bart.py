"""BART (Lewis et al., 2020, "BART: Denoising Sequence-to-Sequence Pre-training for Natural
Language Generation, Translation, and Comprehension"), as released (facebook/bart-base and
facebook/bart-large).

Encoder-decoder, post-LN blocks with biases everywhere, exact GELU, no embedding scale. One
50,265-row token table is shared by both stacks and tied to the softmax, but each stack has its
own learned position table and its own LayerNorm right after the embeddings
(model.stack_embeddings). Each position table has 1,026 rows for 1,024 positions: position p
reads row p + 2 (model.position_offset=2; the first two rows are never read but are in the
checkpoint). No norm after either stack. Counts are those of BartForConditionalGeneration (the
tied table once; `final_logits_bias` is a buffer of zeros, not a parameter):

| preset | layers (enc+dec) | d_model | heads | d_ff  | parameters  |
|--------|------------------|---------|-------|-------|-------------|
| base   | 6 + 6            | 768     | 12    | 3,072 | 139,420,416 |
| large  | 12 + 12          | 1,024   | 16    | 4,096 | 406,291,456 |

`tiny` (2 + 2 x 64, byte vocabulary) is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

BART = dict(
    family="encoder_decoder",
    vocab_size=50265,
    max_len=1024,
    positions="learned",
    position_offset=2,
    stack_embeddings=True,
    embed_norm=True,
    norm_placement="post",
    norm="layernorm",
    norm_eps=1e-5,
    activation="gelu",
    use_bias=True,
    tie_embeddings=True,
    share_embeddings=True,
    dropout=0.1,
)
SOURCE = "released BART checkpoints (Lewis et al. 2020), BartForConditionalGeneration"

PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, d_ff=128, vocab_size=260, max_len=64),
    "base": dict(num_layers=6, d_model=768, num_heads=12, d_ff=3072, published_params=139_420_416),
    "large": dict(
        num_layers=12, d_model=1024, num_heads=16, d_ff=4096, published_params=406_291_456
    ),
}

# Training fields per preset (the rest as in transformers_jax/train_config.py): the numbers
# translation task's range as experiments/t5.py trains it.
TRAINING = {"tiny": dict(TINY_RUN, data=dict(max_number=99_999))}


def get_config(arg: str | None = None):
  return preset_config("bart.py", PRESETS, arg, BART, SOURCE, TRAINING, default="tiny")
