"""GPT-2 (Radford et al., 2019): decoder-only, learned positions, pre-LN, GELU (tanh), tied unembedding.

Presets are the four released models — small 12 x 768, medium 24 x 1024, large 36 x 1280, XL 48 x 1600,
64-dim heads, 50,257-token BPE vocabulary, 1,024 positions — plus `tiny` (2 x 64, byte vocabulary)
for tests, `tiny_8k` (the same at 8,192 tokens per sequence, flash attention) and `cpu` (4 x 128,
byte vocabulary, 0.86M parameters) that trains on the bundled corpus in a few minutes on a
2-core CPU (the README's quick start). Published counts are those of the released checkpoints (the unembedding
is the token embedding, so it is counted once); they equal the lesson's formula
V*d + 1024*d + L*(12d^2 + 13d) + 2d.

    python -m transformers_jax.param_count --config experiments/gpt2.py:small
"""

from transformers_jax.train_config import TINY_RUN, CPU_RUN, preset_config

GPT2 = dict(
    family="decoder",
    vocab_size=50257,
    max_len=1024,
    positions="learned",
    norm_placement="pre",
    norm="layernorm",
    norm_eps=1e-5,
    activation="gelu_tanh",
    tie_embeddings=True,
    use_bias=True,
    dropout=0.1,
    vocab_multiple=128,
)
SOURCE = "released GPT-2 checkpoints (Radford et al. 2019)"

PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, vocab_size=256, max_len=128, dropout=0.0),
    "cpu": dict(num_layers=4, d_model=128, num_heads=4, vocab_size=256, max_len=256, dropout=0.0),
    # `tiny` at 8,192 tokens per sequence with blockwise (flash) attention: memory linear in T
    # (docs/long_context.md); a few seconds a step on a 2-core CPU
    "tiny_8k": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        vocab_size=256,
        max_len=8192,
        dropout=0.0,
        attention_impl="flash",
    ),
    "small": dict(num_layers=12, d_model=768, num_heads=12, published_params=124_439_808),
    "medium": dict(num_layers=24, d_model=1024, num_heads=16, published_params=354_823_168),
    "large": dict(num_layers=36, d_model=1280, num_heads=20, published_params=774_030_080),
    "xl": dict(num_layers=48, d_model=1600, num_heads=25, published_params=1_557_611_200),
}


# Training fields per preset (the rest default as in transformers_jax/train_config.py).
TRAINING = {
    "tiny": TINY_RUN,
    "tiny_8k": dict(
        steps=20,
        batch_size=1,
        seq_len=8192,
        learning_rate=3e-3,
        warmup_steps=4,
        log_every=5,
        eval_every=20,
        checkpoint_every=20,
    ),
    # the README's quick start: a 4 x 128 byte-level GPT, a few minutes on a 2-core CPU
    "cpu": CPU_RUN,
}


def get_config(arg: str | None = None):
  return preset_config("gpt2.py", PRESETS, arg, GPT2, SOURCE, TRAINING)
