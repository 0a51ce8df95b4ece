"""The 2017 Transformer (Vaswani et al., "Attention Is All You Need"), Table 3.

Encoder-decoder, sinusoidal positions, post-LN, ReLU, one 37,000-token vocabulary shared by
source and target embeddings and tied to the pre-softmax projection, embeddings scaled by
sqrt(d_model), dropout 0.1.

| preset | layers (enc+dec) | d_model | d_ff | heads | paper  |
|--------|------------------|---------|------|-------|--------|
| base   | 6 + 6            | 512     | 2048 | 8     | 65M    |
| big    | 6 + 6            | 1024    | 4096 | 16    | 213M   |

This architecture has 63.1M and 214.2M parameters; the paper does not say how it counted (a
37k shared vocabulary leaves base 3% under 65M). `tiny` (2 + 2 x 64, byte vocabulary with
specials) is for tests and CPU runs.
"""

from transformers_jax.train_config import preset_config

TRANSFORMER = dict(
    family="encoder_decoder",
    vocab_size=37000,
    max_len=512,
    positions="sinusoidal",
    norm_placement="post",
    norm="layernorm",
    norm_eps=1e-6,
    activation="relu",
    embed_scale=True,
    tie_embeddings=True,
    share_embeddings=True,
    use_bias=True,
    dropout=0.1,
)
SOURCE = "Vaswani et al. 2017, Table 3"

PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, vocab_size=260, max_len=64, dropout=0.0),
    "base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, published_params=65_000_000),
    "big": dict(
        num_layers=6,
        d_model=1024,
        num_heads=16,
        d_ff=4096,
        dropout=0.3,
        published_params=213_000_000,
    ),
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
    # The paper's schedule peaks at d_model^-0.5 * warmup^-0.5: 6.99e-4 (base), 4.94e-4 (big).
    "base": dict(
        lr_schedule="rsqrt",
        warmup_steps=4000,
        learning_rate=512**-0.5 * 4000**-0.5,
        adam_b2=0.98,
        adam_eps=1e-9,
        label_smoothing=0.1,
        weight_decay=0.0,
    ),
    "big": dict(
        lr_schedule="rsqrt",
        warmup_steps=4000,
        learning_rate=1024**-0.5 * 4000**-0.5,
        adam_b2=0.98,
        adam_eps=1e-9,
        label_smoothing=0.1,
        weight_decay=0.0,
    ),
}


def get_config(arg: str | None = None):
  return preset_config("transformer.py", PRESETS, arg, TRANSFORMER, SOURCE, TRAINING)
