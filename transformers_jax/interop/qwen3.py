"""Qwen3 (Qwen3ForCausalLM) and SmolLM3 (SmolLM3ForCausalLM) <-> the decoder family, on Llama's
tensor names (interop/llama.py).

Qwen3: Llama's blocks with an RMSNorm over each head's queries and keys (q_norm, k_norm: one
gain vector over head_dim, model.qk_norm with qk_norm_kind=head), 128-wide heads whatever the
width, attention_bias on q, k, v and o (never the MLP), and optional sliding-window layers
(use_sliding_window: the layers from max_window_layers on, or config.json's layer_types).
SmolLM3: Llama's blocks where every no_rope_layer_interval-th layer leaves out RoPE (NoPE:
config.json's no_rope_layers, 0 for such a layer; model.layer_types `nope`), optionally with a
sliding window on those layers (use_sliding_window), Llama's attention_bias and mlp_bias.
"""

from __future__ import annotations

from transformers_jax.interop.common import Rule
from transformers_jax.interop.llama import Llama
from transformers_jax.interop.patterns import (
    check_layer_kinds,
    hf_layer_types,
    read_layer_types,
    rotary_layers,
)


def qk_norm_rules(h: str, attn: tuple[str, ...]) -> list[Rule]:
  """q_norm and k_norm (one weight each) <-> query_norm and key_norm."""
  return [
      Rule("copy", (h + "q_norm.weight",), (attn + ("query_norm", "scale"),)),
      Rule("copy", (h + "k_norm.weight",), (attn + ("key_norm", "scale"),)),
  ]


class Qwen3(Llama):
  model_type = "qwen3"
  architectures = {"Qwen3ForCausalLM": ("lm",)}
  base_prefix = {"Qwen3ForCausalLM": "model."}
  biases = ("attention_bias",)
  qk_norm_kind = "head"
  defaults = dict(
      Llama.defaults,
      vocab_size=151936,
      intermediate_size=22016,
      num_key_value_heads=32,
      head_dim=128,
      max_position_embeddings=32768,
      attention_bias=False,
      use_sliding_window=False,
      sliding_window=4096,
      max_window_layers=28,
  )
  token_defaults = {}

  def fields(self, hf, architecture, where):
    out = super().fields(hf, architecture, where)
    window = hf["sliding_window"] if hf["use_sliding_window"] else None
    if not hf.get("layer_types") and window:  # transformers' rule: from max_window_layers on
      first, layers = hf["max_window_layers"], hf["num_hidden_layers"]
      kinds = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
      hf = dict(hf, layer_types=kinds)
    pattern = read_layer_types(hf, where, window)
    sliding = "sliding" in pattern.split(",")
    return dict(
        out,
        qk_norm=True,
        qk_norm_kind=self.qk_norm_kind,
        layer_types=pattern,
        sliding_window=window if sliding else 0,
    )

  def hf_config(self, c, architecture):
    types = hf_layer_types(c)
    first = next((i for i, t in enumerate(types) if t == "sliding_attention"), c.num_layers)
    return dict(
        super().hf_config(c, architecture),
        layer_types=types,
        use_sliding_window=bool(c.sliding_window),
        sliding_window=c.sliding_window or None,
        max_window_layers=first,
    )

  def attention_rules(self, c, h, attn):
    return super().attention_rules(c, h, attn) + qk_norm_rules(h, attn)

  def default_architecture(self, c):
    return None  # (Llama's chooses among the RoPE decoders)

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        qk_norm=True,
        qk_norm_kind=self.qk_norm_kind,
        layer_types=c.layer_types,  # full and sliding layers in any order (check_exportable)
        sliding_window=c.sliding_window,
        sliding_every=c.sliding_every,
    )

  def check_exportable(self, c, architecture):
    check_layer_kinds(c, architecture, ("full", "sliding"))


class SmolLM3(Llama):
  model_type = "smollm3"
  architectures = {"SmolLM3ForCausalLM": ("lm",)}
  base_prefix = {"SmolLM3ForCausalLM": "model."}
  defaults = dict(
      Llama.defaults,
      vocab_size=128256,
      hidden_size=2048,
      intermediate_size=11008,
      num_hidden_layers=36,
      num_attention_heads=16,
      num_key_value_heads=4,
      max_position_embeddings=32768,
      rope_theta=2000000.0,
      use_sliding_window=False,
      sliding_window=None,
      no_rope_layer_interval=4,
      tie_word_embeddings=True,
  )
  token_defaults = dict(pad_token_id=128004, bos_token_id=128000, eos_token_id=128001)

  def fields(self, hf, architecture, where):
    out = super().fields(hf, architecture, where)
    layers = hf["num_hidden_layers"]
    rotary = hf.get("no_rope_layers")
    if rotary is None:  # transformers' rule: every no_rope_layer_interval-th layer is NoPE
      interval = hf["no_rope_layer_interval"]
      rotary = [int((i + 1) % interval != 0) for i in range(layers)]
    window = hf["sliding_window"] if hf["use_sliding_window"] else None
    if not hf.get("layer_types") and window:  # transformers' rule: the NoPE layers slide
      hf = dict(hf, layer_types=["full_attention" if r else "sliding_attention" for r in rotary])
    pattern = read_layer_types(hf, where, window, rotary)
    sliding = any(t.startswith("sliding") for t in pattern.split(","))
    return dict(out, layer_types=pattern, sliding_window=window if sliding else 0)

  def hf_config(self, c, architecture):
    return dict(
        super().hf_config(c, architecture),
        layer_types=hf_layer_types(c),
        no_rope_layers=rotary_layers(c),
        use_sliding_window=bool(c.sliding_window),
        sliding_window=c.sliding_window or None,
    )

  def default_architecture(self, c):
    return None

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        layer_types=c.layer_types,  # full, sliding, NoPE (check_exportable)
        sliding_window=c.sliding_window,
        sliding_every=c.sliding_every,
    )

  def check_exportable(self, c, architecture):
    check_layer_kinds(c, architecture, ("full", "nope", "sliding", "sliding_nope"))
