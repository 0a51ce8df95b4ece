"""Marian (Junczys-Dowmunt et al., 2018, "Marian: Fast Neural Machine Translation in C++") as the
OPUS-MT translation models release it (Tiedemann & Thottingal, 2020; Helsinki-NLP/opus-mt-en-de,
MarianMTModel).

Encoder-decoder, post-LN blocks with biases, SiLU (swish) feed-forward without a gate,
token embeddings scaled by sqrt(d_model), fixed sinusoidal positions laid out sines first, then
cosines (model.positions=sinusoidal_halves), one vocabulary shared by both stacks and tied to
the softmax, no norm after either stack.

| preset | layers (enc+dec) | d_model | heads | d_ff  | vocabulary | parameters |
|--------|------------------|---------|-------|-------|------------|------------|
| en-de  | 6 + 6            | 512     | 8     | 2,048 | 58,101     | 73,886,208 |

The count is that of the trained tensors. The hub lists 74.4M parameters for the same
checkpoint because MarianMTModel also stores each stack's sinusoid table (512 x 512, not
trained) as a parameter: 73,886,208 + 2 x 262,144 = 74,410,496. This project computes those
tables from the formula, so they are not parameters here.

`tiny` (2 + 2 x 64, byte vocabulary) is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

MARIAN = dict(
    family="encoder_decoder",
    vocab_size=58101,
    max_len=512,
    positions="sinusoidal_halves",
    norm_placement="post",
    norm="layernorm",
    norm_eps=1e-5,
    activation="silu",
    use_bias=True,
    embed_scale=True,
    tie_embeddings=True,
    share_embeddings=True,
    dropout=0.1,
)
SOURCE = "Helsinki-NLP OPUS-MT checkpoints (Tiedemann & Thottingal 2020), MarianMTModel"

PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, d_ff=128, vocab_size=260, max_len=64),
    "en-de": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, published_params=73_886_208),
}

# Training fields per preset (the rest as in transformers_jax/train_config.py): the numbers
# translation task's range as experiments/t5.py trains it.
TRAINING = {"tiny": dict(TINY_RUN, data=dict(max_number=99_999))}


def get_config(arg: str | None = None):
  return preset_config("marian.py", PRESETS, arg, MARIAN, SOURCE, TRAINING, default="tiny")
