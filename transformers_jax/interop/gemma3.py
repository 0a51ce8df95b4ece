"""Gemma 3's text model (Gemma3ForCausalLM, model type gemma3_text) <-> the decoder family, on
Gemma 2's tensors and blocks (interop/gemma.py): a norm before and after each sublayer, (1 + w)
RMSNorms, embeddings times sqrt(d_model), a tied unembedding, scores over
sqrt(query_pre_attn_scalar); and Gemma 3's own: an RMSNorm over each head's queries and keys
(q_norm, k_norm, also (1 + w): model.qk_norm), sliding-window and full layers as config.json's
layer_types lists them (five sliding to one full in the releases: model.layer_types), the
sliding layers' RoPE at their own base (rope_local_base_freq, 10,000: model.rope_local_theta)
and the full layers' with linear scaling (4B and up: factor 8, model.rope_scaling=linear:8),
and no soft-capping of the logits unless config.json asks for it. transformers' Gemma 3 never
passes attn_logit_softcapping to its attention (Gemma 2's does): the import leaves it out as
transformers does, and the export refuses a model that caps its attention scores.
Bidirectional attention (the embedding models' use_bidirectional_attention) is refused."""

from __future__ import annotations

from transformers_jax.interop.common import UnsupportedConfig, require
from transformers_jax.interop.gemma import Gemma2
from transformers_jax.interop.patterns import (
    check_layer_kinds,
    hf_layer_types,
    read_layer_types,
    read_typed_rope,
    typed_rope_parameters,
)
from transformers_jax.interop.qwen3 import qk_norm_rules


class Gemma3(Gemma2):
  model_type = "gemma3_text"
  architectures = {"Gemma3ForCausalLM": ("lm",)}
  base_prefix = {"Gemma3ForCausalLM": "model."}
  THETA, LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3TextConfig's defaults
  defaults = dict(
      Gemma2.defaults,
      vocab_size=262208,
      max_position_embeddings=131072,
      final_logit_softcapping=None,
      attn_logit_softcapping=None,
      use_bidirectional_attention=False,
  )
  token_defaults = dict(pad_token_id=0, bos_token_id=2, eos_token_id=1)

  def config(self, hf):
    hf = super().config(hf)
    if not hf.get("layer_types"):  # the hub's files: sliding_window_pattern (6) instead
      period, layers = hf.get("sliding_window_pattern", 6), hf["num_hidden_layers"]
      kinds = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)]
      hf = dict(hf, layer_types=kinds)
    return hf

  def fields(self, hf, architecture, where):
    require(hf, where, use_bidirectional_attention=False)
    out = self.sandwich_fields(dict(hf, rope_parameters={}, rope_scaling=None), architecture, where)
    theta, scaling, local = read_typed_rope(hf, where, self.THETA, self.LOCAL_THETA)
    window = hf.get("sliding_window")
    pattern = read_layer_types(hf, where, window)
    sliding = "sliding" in pattern.split(",")
    return dict(
        out,
        attention_softcap=0.0,  # (config.json's attn_logit_softcapping: unused by transformers)
        qk_norm=True,
        qk_norm_kind="head",
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local if sliding else 0.0,
        layer_types=pattern,
        sliding_window=window if sliding else 0,
        sliding_every=1,
    )

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    for key in ("rope_theta", "rope_scaling"):
      out.pop(key)
    return dict(
        out,
        rope_parameters=typed_rope_parameters(c),
        layer_types=hf_layer_types(c),
        sliding_window=c.sliding_window or c.max_len,  # (Gemma 2's: one is always needed)
        use_bidirectional_attention=False,
        attn_logit_softcapping=None,
    )

  def attention_rules(self, c, h, attn):
    return super().attention_rules(c, h, attn) + qk_norm_rules(h, attn)

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        qk_norm=True,
        qk_norm_kind="head",
        attention_softcap=0.0,  # transformers' Gemma 3 has no attention soft-capping
        layer_types=c.layer_types,
        sliding_every=c.sliding_every,
        rope_local_theta=c.rope_local_theta,
    )

  def check_exportable(self, c, architecture):
    check_layer_kinds(c, architecture, ("full", "sliding"))
    if c.d_model % c.num_heads:  # Gemma3TextConfig refuses it
      raise UnsupportedConfig(
          f"cannot write model.num_heads={c.num_heads} as {architecture}, whose config needs "
          f"heads that divide d_model={c.d_model}: change the config"
      )
