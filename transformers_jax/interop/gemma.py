"""Gemma (GemmaForCausalLM) and Gemma 2 (Gemma2ForCausalLM) <-> the decoder family, on Llama's
tensor names (interop/llama.py): tanh-GELU gating, embeddings times sqrt(d_model), RMSNorm
weights stored as w and applied as 1 + w, a tied unembedding; Gemma 2 adds norms after each
sublayer, soft-capping and alternating sliding-window blocks."""

from __future__ import annotations

from transformers_jax.interop.common import UnsupportedArchitecture
from transformers_jax.interop.llama import Llama


class Gemma(Llama):
  """Gemma (GemmaForCausalLM): Llama's tensors, with tanh-GELU gating, embeddings scaled by
  sqrt(d_model), RMSNorm weights stored as w and applied as 1 + w, and a tied unembedding."""

  model_type = "gemma"
  architectures = {"GemmaForCausalLM": ("lm",)}
  base_prefix = {"GemmaForCausalLM": "model."}
  activation = ("geglu_tanh", "gelu_pytorch_tanh")
  gemma = True
  biases = ()  # attention_bias and mlp_bias must be off
  defaults = dict(
      Llama.defaults,
      vocab_size=256000,
      hidden_size=3072,
      intermediate_size=24576,
      num_hidden_layers=28,
      num_attention_heads=16,
      num_key_value_heads=16,
      head_dim=256,
      max_position_embeddings=8192,
      tie_word_embeddings=True,
  )

  def config(self, hf):
    hf = super().config(hf)
    # Gemma's configs name the feed-forward's function hidden_activation (hidden_act is older)
    act = hf.get("hidden_activation") or hf.get("hidden_act") or self.activation[1]
    return dict(hf, hidden_act="gelu_pytorch_tanh" if act == "gelu" else act)

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    return dict(out, hidden_activation=self.activation[1])


class Gemma2(Gemma):
  """Gemma 2 (Gemma2ForCausalLM): Gemma with a norm before and after each sublayer (sandwich),
  attention and final-logit soft-capping, and a sliding window on every other block (the first
  included). Scores are divided by sqrt(query_pre_attn_scalar): head_dim, or 27B's 144 over
  128-wide heads (model.score_scale_width)."""

  model_type = "gemma2"
  architectures = {"Gemma2ForCausalLM": ("lm",)}
  base_prefix = {"Gemma2ForCausalLM": "model."}
  norms = (
      ("input_layernorm", "self_attn_norm_in"),
      ("post_attention_layernorm", "self_attn_norm_out"),
      ("pre_feedforward_layernorm", "ffn_norm_in"),
      ("post_feedforward_layernorm", "ffn_norm_out"),
  )
  defaults = dict(
      Gemma.defaults,
      hidden_size=2304,
      intermediate_size=9216,
      num_hidden_layers=26,
      num_attention_heads=8,
      num_key_value_heads=4,
      query_pre_attn_scalar=256,
      sliding_window=4096,
      final_logit_softcapping=30.0,
      attn_logit_softcapping=50.0,
  )

  def sandwich_fields(self, hf, architecture, where):
    """Gemma's fields with Gemma 2's norms, soft-caps and score scale (Gemma 3's too)."""
    out = super().fields(hf, architecture, where)
    head_dim = out["head_dim"] or out["d_model"] // out["num_heads"]
    width = hf["query_pre_attn_scalar"]
    if not isinstance(width, int) or width < 1:
      raise UnsupportedArchitecture(
          f"{where}: query_pre_attn_scalar={width!r} must be a positive integer (a width whose "
          "square root divides the scores)"
      )
    return dict(
        out,
        norm_placement="sandwich",
        attention_softcap=float(hf["attn_logit_softcapping"] or 0.0),
        logit_softcap=float(hf["final_logit_softcapping"] or 0.0),
        score_scale_width=0 if width == head_dim else width,
    )

  def fields(self, hf, architecture, where):
    out = self.sandwich_fields(hf, architecture, where)
    layers = hf["num_hidden_layers"]
    sliding = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if hf.get("layer_types") not in (None, sliding):
      raise UnsupportedArchitecture(
          f"{where}: layer_types other than sliding and full attention alternating from the "
          "first layer are not supported"
      )
    window = hf["sliding_window"] or 0  # (one that no position reaches is none)
    window = window if window < hf["max_position_embeddings"] else 0
    return dict(out, sliding_window=window, sliding_every=2)

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    layer_types = [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c.num_layers)
    ]
    return dict(
        out,
        query_pre_attn_scalar=c.score_scale_width or c.head_width,
        # transformers builds the sliding layers' mask whatever the layers: a window no
        # position reaches where there is none
        sliding_window=c.sliding_window or c.max_len,
        layer_types=layer_types,
        attn_logit_softcapping=c.attention_softcap or None,
        final_logit_softcapping=c.logit_softcap or None,
    )

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        norm_placement="sandwich",
        sliding_window=c.sliding_window,
        sliding_every=2 if c.sliding_window else c.sliding_every,
        attention_softcap=c.attention_softcap,
        logit_softcap=c.logit_softcap,
        score_scale_width=c.score_scale_width,
    )
