"""Qwen3's mixtures of experts (Qwen3MoeForCausalLM) <-> the decoder family: Llama's blocks and
tensor names (interop/llama.py) with a per-head RMSNorm of queries and keys over head_dim
(self_attn.q_norm / k_norm: model.qk_norm, norm=rmsnorm), and routed SwiGLU experts
(mlp.gate, mlp.experts.{e}.gate_proj / up_proj / down_proj), top-k of the softmax,
renormalised when norm_topk_prob (model.router_norm_topk). decoder_sparse_step n puts experts
in every n-th block (model.moe_every) where the dense blocks are as wide as an expert;
mlp_only_layers is refused. use_sliding_window slides every block over sliding_window."""

from __future__ import annotations

from transformers_jax.interop.common import Rule, UnsupportedArchitecture, get, require
from transformers_jax.interop.llama import Llama
from transformers_jax.interop.rope_scaling import read_rope, write_rope


class Qwen3Moe(Llama):
  model_type = "qwen3_moe"
  architectures = {"Qwen3MoeForCausalLM": ("lm",)}
  base_prefix = {"Qwen3MoeForCausalLM": "model."}
  feed_forward = "moe"
  aliases = {"num_local_experts": "num_experts"}  # what transformers 5 writes for the hub's key
  defaults = dict(
      vocab_size=151936,
      hidden_size=2048,
      intermediate_size=6144,
      moe_intermediate_size=768,
      num_hidden_layers=24,
      num_attention_heads=32,
      num_key_value_heads=4,
      hidden_act="silu",
      max_position_embeddings=32768,
      initializer_range=0.02,
      rms_norm_eps=1e-6,
      tie_word_embeddings=False,
      attention_bias=False,
      use_sliding_window=False,
      sliding_window=4096,
      attention_dropout=0.0,
      decoder_sparse_step=1,
      num_experts_per_tok=8,
      num_experts=128,
      norm_topk_prob=False,
  )
  summary_keys = Llama.summary_keys + ("moe_intermediate_size", "num_experts")

  def check(self, hf, where):
    require(hf, where, hidden_act="silu", attention_bias=False, mlp_only_layers=[])

  def fields(self, hf, architecture, where):
    rope = ("rope_parameters", "rope_scaling")  # read here: YaRN too (interop/rope_scaling.py)
    out = super().fields({k: v for k, v in hf.items() if k not in rope}, architecture, where)
    step = hf["decoder_sparse_step"]
    if not isinstance(step, int) or step < 1:
      raise UnsupportedArchitecture(
          f"{where}: decoder_sparse_step={step!r}: give a positive integer"
      )
    if step > 1 and hf["intermediate_size"] != hf["moe_intermediate_size"]:
      raise UnsupportedArchitecture(
          f"{where}: decoder_sparse_step={step} with dense blocks of intermediate_size="
          f"{hf['intermediate_size']} beside experts of moe_intermediate_size="
          f"{hf['moe_intermediate_size']} is not supported (one d_ff for both): use a "
          "checkpoint whose every block has experts"
      )
    if not hf["num_experts"]:
      raise UnsupportedArchitecture(
          f"{where}: num_experts={hf['num_experts']!r}: a model without experts is Qwen3 "
          "(model_type qwen3), not qwen3_moe"
      )
    theta, scaling = read_rope(hf, where, 10000.0)
    window = hf["sliding_window"] if hf["use_sliding_window"] else 0
    return dict(
        out,
        head_dim=get(hf, "head_dim", default=out["d_model"] // out["num_heads"]),
        d_ff=hf["moe_intermediate_size"],
        rope_theta=theta,
        rope_scaling=scaling,
        qk_norm=True,
        sliding_window=window or 0,
        sliding_every=1,
        feed_forward="moe",
        moe_impl="ragged",
        moe_dropless=True,
        moe_every=step,
        num_experts=hf["num_experts"],
        top_k=hf["num_experts_per_tok"],
        router_norm_topk=bool(hf["norm_topk_prob"]),
    )

  def hf_config(self, c, architecture):
    out = super().hf_config(c.replace(rope_scaling=""), architecture)
    del out["mlp_bias"]
    return dict(
        out,
        **write_rope(c),
        intermediate_size=c.ff_width,
        moe_intermediate_size=c.ff_width,
        decoder_sparse_step=c.moe_every,
        mlp_only_layers=[],
        num_experts=c.num_experts,
        num_experts_per_tok=c.top_k,
        norm_topk_prob=c.router_norm_topk,
        use_sliding_window=bool(c.sliding_window),
        sliding_window=c.sliding_window or None,
    )

  def rules(self, c, base):
    rules = super().rules(c, base)
    for i in range(c.num_layers):
      h, attn = f"{base}layers.{i}.self_attn.", ("decoder", f"layer_{i}", "self_attn")
      rules.append(Rule("copy", (h + "q_norm.weight",), (attn + ("query_norm", "scale"),)))
      rules.append(Rule("copy", (h + "k_norm.weight",), (attn + ("key_norm", "scale"),)))
    return rules

  def ffn_rules(self, c, h, ffn):
    if not c.is_moe_layer(int(h.split(".")[-2])):  # a dense block (decoder_sparse_step)
      return Llama.ffn_rules(self, c, h, ffn)
    mlp = h + "mlp."
    rules = [Rule("linear", (mlp + "gate.weight",), (ffn + ("router", "kernel"),))]
    for hf_name, name in (("gate_proj", "wi"), ("up_proj", "wi_1"), ("down_proj", "wo")):
      names = tuple(f"{mlp}experts.{e}.{hf_name}.weight" for e in range(c.num_experts))
      rules.append(Rule("experts", names, (ffn + (name,),)))
    return rules

  def default_architecture(self, c):
    """A RoPE decoder with experts and q/k norms is written as Qwen3-MoE."""
    if c.family == "decoder" and c.feed_forward == "moe" and c.qk_norm and not c.attention_sinks:
      return "Qwen3MoeForCausalLM"
    return None

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        qk_norm=True,
        router_norm_topk=(True, False),
        sliding_every=1,
        sliding_window=c.sliding_window,
        rope_scaling=c.rope_scaling,  # none, yarn or llama3, all written
    )
