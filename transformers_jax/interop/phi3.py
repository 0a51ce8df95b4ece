"""Phi-3 and Phi-4 (Phi3ForCausalLM) <-> the decoder family: Llama's blocks (interop/llama.py)
with the query, key and value projections fused into one qkv_proj ([(H + 2G) K, D]) and the
gate and up projections into one gate_up_proj ([2F, D], gate first), no biases, and a sliding
window on every layer when config.json gives one (Phi-3-mini-4k: 2,047). RoPE over part of each
head (partial_rotary_factor below 1: Phi-4-mini) and the long-context "longrope" scaling
(Phi-3's 128k models) have no counterpart and are refused."""

from __future__ import annotations

from transformers_jax.interop.common import Rule, UnsupportedArchitecture
from transformers_jax.interop.llama import Llama


class Phi3(Llama):
  model_type = "phi3"
  architectures = {"Phi3ForCausalLM": ("lm",)}
  base_prefix = {"Phi3ForCausalLM": "model."}
  biases = ()
  defaults = dict(
      Llama.defaults,
      vocab_size=32064,
      hidden_size=3072,
      intermediate_size=8192,
      num_hidden_layers=32,
      num_attention_heads=32,
      max_position_embeddings=4096,
      rms_norm_eps=1e-5,
      sliding_window=None,
      resid_pdrop=0.0,
      embd_pdrop=0.0,
  )
  token_defaults = dict(pad_token_id=32000, bos_token_id=1, eos_token_id=32000)

  def fields(self, hf, architecture, where):
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    factor = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
      raise UnsupportedArchitecture(
          f"{where}: partial_rotary_factor={factor!r} is not supported (RoPE rotates every "
          "feature of a head here): use a checkpoint with 1.0"
      )
    if rope.get("rope_type", rope.get("type", "default")) in ("longrope", "su", "yarn"):
      raise UnsupportedArchitecture(
          f"{where}: RoPE scaling 'longrope' is not supported (only 'llama3' and 'linear'): use "
          "a checkpoint without it (the 4k-context models)"
      )
    out = super().fields(hf, architecture, where)
    window = hf.get("sliding_window")
    window = window if window is not None and window < hf["max_position_embeddings"] else 0
    return dict(out, sliding_window=window)

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    for key in ("attention_bias", "mlp_bias"):
      out.pop(key, None)
    return dict(
        out,
        sliding_window=c.sliding_window or None,
        original_max_position_embeddings=c.max_len,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
    )

  def attention_rules(self, c, h, attn):
    qkv = (attn + ("query", "kernel"), attn + ("key", "kernel"), attn + ("value", "kernel"))
    return [
        Rule("fused_linear", (h + "qkv_proj.weight",), qkv),
        Rule("linear", (h + "o_proj.weight",), (attn + ("out", "kernel"),), 2),
    ]

  def ffn_rules(self, c, h, ffn):
    gate_up = (ffn + ("wi_0", "kernel"), ffn + ("wi_1", "kernel"))
    return [
        Rule("fused_linear", (h + "mlp.gate_up_proj.weight",), gate_up),
        Rule("linear", (h + "mlp.down_proj.weight",), (ffn + ("wo", "kernel"),)),
    ]

  def default_architecture(self, c):
    return None  # written as Phi-3 only when asked for (Llama's tensors are unfused)

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture), sliding_window=c.sliding_window, sliding_every=1
    )
