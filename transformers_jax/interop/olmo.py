"""OLMo 2 (Olmo2ForCausalLM) and OLMo 3 (Olmo3ForCausalLM) <-> the decoder family, on Llama's
tensor names (interop/llama.py).

OLMo 2: the norm after each sublayer, inside the residual (x + N(f(x)):
model.norm_placement=reordered, post_attention_layernorm and post_feedforward_layernorm), an
RMSNorm over the whole query and key projections (q_norm [H*K], k_norm [G*K]: model.qk_norm with
qk_norm_kind=full), attention_bias on q, k, v and o, an untied head. OLMo 3 adds sliding-window
layers (config.json's layer_types: three sliding, one full by default) whose RoPE may differ
from the full layers' (rope_parameters per layer type: model.rope_local_theta)."""

from __future__ import annotations

from transformers_jax.interop.llama import Llama
from transformers_jax.interop.patterns import (
    check_layer_kinds,
    hf_layer_types,
    read_layer_types,
    read_typed_rope,
    typed_rope_parameters,
)
from transformers_jax.interop.qwen3 import qk_norm_rules


class Olmo2(Llama):
  model_type = "olmo2"
  architectures = {"Olmo2ForCausalLM": ("lm",)}
  base_prefix = {"Olmo2ForCausalLM": "model."}
  biases = ("attention_bias",)
  explicit_head_dim = False  # hidden_size / num_attention_heads
  norms = (
      ("post_attention_layernorm", "self_attn_norm"),
      ("post_feedforward_layernorm", "ffn_norm"),
  )
  defaults = dict(
      Llama.defaults,
      vocab_size=50304,
      max_position_embeddings=2048,
      rms_norm_eps=1e-5,
      attention_bias=False,
  )
  token_defaults = dict(pad_token_id=1, eos_token_id=50279)

  def fields(self, hf, architecture, where):
    out = super().fields(hf, architecture, where)
    return dict(out, norm_placement="reordered", qk_norm=True, qk_norm_kind="full")

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    out.pop("head_dim")
    return out

  def attention_rules(self, c, h, attn):
    return super().attention_rules(c, h, attn) + qk_norm_rules(h, attn)

  def default_architecture(self, c):
    return None  # (Llama's chooses among the RoPE decoders)

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        norm_placement="reordered",
        qk_norm=True,
        qk_norm_kind="full",
    )


class Olmo3(Olmo2):
  model_type = "olmo3"
  architectures = {"Olmo3ForCausalLM": ("lm",)}
  base_prefix = {"Olmo3ForCausalLM": "model."}
  THETA = 500000.0  # Olmo3Config's default_theta, both layer types'
  defaults = dict(Olmo2.defaults, sliding_window=4096)

  def config(self, hf):
    hf = super().config(hf)
    if not hf.get("layer_types"):  # transformers' rule: every fourth layer attends fully
      layers = hf["num_hidden_layers"]
      kinds = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)]
      hf = dict(hf, layer_types=kinds)
    return hf

  def fields(self, hf, architecture, where):
    # (transformers gives the sliding layers the default base when config.json has rope_theta
    # rather than rope_parameters per layer type)
    theta, scaling, local = read_typed_rope(hf, where, self.THETA, self.THETA)
    out = super().fields(dict(hf, rope_parameters={}, rope_scaling=None), architecture, where)
    window = hf.get("sliding_window")
    pattern = read_layer_types(hf, where, window)
    sliding = "sliding" in pattern.split(",")
    return dict(
        out,
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local if sliding else 0.0,
        layer_types=pattern,
        sliding_window=window if sliding else 0,
    )

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    for key in ("rope_theta", "rope_scaling"):
      out.pop(key)
    return dict(
        out,
        rope_parameters=typed_rope_parameters(c),
        layer_types=hf_layer_types(c),
        sliding_window=c.sliding_window or None,
    )

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        layer_types=c.layer_types,
        sliding_window=c.sliding_window,
        sliding_every=c.sliding_every,
        rope_local_theta=c.rope_local_theta,
    )

  def check_exportable(self, c, architecture):
    check_layer_kinds(c, architecture, ("full", "sliding"))
