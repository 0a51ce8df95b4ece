"""OLMo 2 (Team OLMo, 2024, "2 OLMo 2 Furious"), as released (Olmo2ForCausalLM; config values
from the Hugging Face configs allenai/OLMo-2-1124-7B, allenai/OLMo-2-1124-13B and
allenai/OLMo-2-0325-32B).

Llama's blocks with the norm after each sublayer, inside the residual: x + N(f(x))
(model.norm_placement=reordered; RMSNorm, eps 1e-6), an RMSNorm over the whole query and key
projections (model.qk_norm, qk_norm_kind=full: H*K + G*K parameters per layer), RoPE at theta
500,000, SwiGLU, no biases, an untied head and a 100,352-row vocabulary. Counts are
transformers' Olmo2ForCausalLM built from each config on the meta device:

| preset | layers | d_model | heads / kv | d_ff   | parameters     |
|--------|--------|---------|------------|--------|----------------|
| 2-7b   | 32     | 4,096   | 32 / 32    | 11,008 | 7,298,617,344  |
| 2-13b  | 40     | 5,120   | 40 / 40    | 13,824 | 13,716,198,400 |
| 2-32b  | 64     | 5,120   | 40 / 8     | 27,648 | 32,234,279,936 |

OLMo 3 (Olmo3ForCausalLM) adds sliding-window layers (three to each full one) with their own
RoPE settings, which the blocks express (model.layer_types, rope_local_theta; interop/olmo.py
reads and writes them), but its released full layers use YaRN RoPE scaling, which has no
counterpart here: no OLMo 3 preset. `tiny` is for tests and CPU runs.
"""

from transformers_jax.train_config import TINY_RUN, preset_config

OLMO2 = dict(
    family="decoder",
    positions="rope",
    rope_theta=500000.0,
    norm_placement="reordered",
    norm="rmsnorm",
    norm_eps=1e-6,
    qk_norm=True,
    qk_norm_kind="full",
    activation="swiglu",
    use_bias=False,
    tie_embeddings=False,
    vocab_size=100352,
    max_len=4096,
    dropout=0.0,
)
SOURCE = "released OLMo 2 checkpoints (Olmo2ForCausalLM; allenai/OLMo-2-*)"


def _size(layers, d_model, heads, kv_heads, d_ff, published):
  return dict(
      num_layers=layers,
      d_model=d_model,
      num_heads=heads,
      num_kv_heads=kv_heads,
      d_ff=d_ff,
      scan_layers=True,
      published_params=published,
  )


PRESETS = {
    "tiny": dict(
        num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128, vocab_size=256, max_len=128
    ),
    "2-7b": _size(32, 4096, 32, 32, 11008, 7_298_617_344),
    "2-13b": _size(40, 5120, 40, 40, 13824, 13_716_198_400),
    "2-32b": _size(64, 5120, 40, 8, 27648, 32_234_279_936),
}

TRAINING = {"tiny": TINY_RUN}


def get_config(arg: str | None = None):
  return preset_config("olmo.py", PRESETS, arg, OLMO2, SOURCE, TRAINING, default="tiny")
