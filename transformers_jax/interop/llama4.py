"""Llama 4's text model (Llama4ForCausalLM, model type llama4_text) <-> the decoder family:
pre-norm RMSNorm, grouped-query attention without biases, RoPE on the blocks config.json's
no_rope_layers marks 1 (chunked over attention_chunk_size where that is set: layer_types
"chunked"), none on the others ("nope"; their queries take the attention temperature with
attn_temperature_tuning: model.attention_temperature_floor / _scale = floor_scale / attn_scale),
the weightless RMS norm of queries and keys on the RoPE blocks (use_qk_norm: qk_norm_kind=l2,
qk_norm_rope_only), and every interleave_moe_layer_step-th block (moe_layers) a mixture of
experts: a router choosing num_experts_per_tok experts, each chosen logit's sigmoid scaling the
token on its way into the expert (model.moe_scale_input), beside one shared expert; the other
blocks a SwiGLU of intermediate_size_mlp (model.moe_dense_d_ff).

Tensors: feed_forward.router.weight [E, D]; feed_forward.experts.gate_up_proj [E, D, 2F] (the
gate's columns, then up's), down_proj [E, F, D]; feed_forward.shared_expert.{gate,up,down}_proj;
the dense blocks' feed_forward.{gate,up,down}_proj. Llama 4 rotates interleaved pairs of each
head's features (2i, 2i + 1); the rows of q_proj and k_proj are reordered, even features first,
on import (so that our half-split RoPE computes the same scores; the same order on the NoPE
blocks changes no score) and put back on export.
"""

from __future__ import annotations

from transformers_jax.interop.common import (
    ROPE_DECODER,
    Family,
    Rule,
    UnsupportedArchitecture,
    UnsupportedConfig,
    decoder_rules,
    decoder_shape,
    linear,
    require,
)
from transformers_jax.interop.deepseek import rope_rows
from transformers_jax.interop.rope_scaling import read_rope, write_rope
from transformers_jax.modules import layer_types as patterns


def rope_flags(hf, where: str) -> list[int]:
  """config.json's no_rope_layers (1: the layer rotates), or transformers' default from
  no_rope_layer_interval (every interval-th layer without RoPE)."""
  layers, flags = hf["num_hidden_layers"], hf.get("no_rope_layers")
  if not flags:
    interval = hf["no_rope_layer_interval"]
    return [int((i + 1) % interval != 0) for i in range(layers)]
  if len(flags) != layers or set(flags) - {0, 1}:
    raise UnsupportedArchitecture(
        f"{where}: no_rope_layers must give 0 or 1 for each of the {layers} layers: use the "
        "config.json saved with the weights"
    )
  return list(flags)


def block_types(hf, where: str) -> list[str]:
  """Each layer's model.layer_types entry: chunked (RoPE, with a chunk), full (RoPE) or nope."""
  chunk = hf.get("attention_chunk_size")
  ours = ["nope" if not r else "chunked" if chunk else "full" for r in rope_flags(hf, where)]
  given = hf.get("layer_types")
  theirs = ["chunked_attention" if t == "chunked" else "full_attention" for t in ours]
  if given and list(given) != theirs:
    raise UnsupportedArchitecture(
        f"{where}: layer_types {list(given)} is not supported (only chunked_attention on the RoPE "
        "layers when attention_chunk_size is set, full_attention elsewhere, as transformers "
        "derives them): use the config.json saved with the weights"
    )
  return ours


class Llama4Text(Family):
  model_type = "llama4_text"
  architectures = {"Llama4ForCausalLM": ("lm",)}
  base_prefix = {"Llama4ForCausalLM": "model."}
  load_prefix = "model."
  explicit_head_dim = True
  defaults = dict(  # transformers' Llama4TextConfig
      vocab_size=202048,
      hidden_size=5120,
      intermediate_size=8192,
      intermediate_size_mlp=16384,
      num_hidden_layers=48,
      num_attention_heads=40,
      num_key_value_heads=8,
      head_dim=128,
      hidden_act="silu",
      max_position_embeddings=4096 * 32,
      initializer_range=0.02,
      rms_norm_eps=1e-5,
      tie_word_embeddings=False,
      attention_dropout=0.0,
      num_experts_per_tok=1,
      num_local_experts=16,
      interleave_moe_layer_step=1,
      use_qk_norm=True,
      no_rope_layer_interval=4,
      attention_chunk_size=8192,
      attn_temperature_tuning=True,
      floor_scale=8192,
      attn_scale=0.1,
      attention_bias=False,
  )
  summary_keys = (
      "num_hidden_layers",
      "hidden_size",
      "num_attention_heads",
      "num_key_value_heads",
      "head_dim",
      "intermediate_size",
      "intermediate_size_mlp",
      "num_local_experts",
      "vocab_size",
  )

  def config(self, hf):
    """As Family's, except that an attention_chunk_size given as null means no chunks (where a
    missing one takes the default, 8,192)."""
    out = super().config(hf)
    if "attention_chunk_size" in hf and hf["attention_chunk_size"] is None:
      out["attention_chunk_size"] = None
    return out

  def fields(self, hf, architecture, where):
    require(hf, where, hidden_act="silu", attention_bias=False)
    layers, step = hf["num_hidden_layers"], hf["interleave_moe_layer_step"]
    if not 1 <= step <= layers:
      raise UnsupportedArchitecture(
          f"{where}: interleave_moe_layer_step={step!r} is not supported (1 to "
          f"num_hidden_layers={layers}: a model with MoE blocks)"
      )
    moe_layers = hf.get("moe_layers")
    if moe_layers is not None and list(moe_layers) != list(range(step - 1, layers, step)):
      raise UnsupportedArchitecture(
          f"{where}: moe_layers {list(moe_layers)} is not supported (only every "
          "interleave_moe_layer_step-th layer, as transformers derives them): use a checkpoint "
          "without it"
      )
    types = block_types(hf, where)
    nope, rope = "nope" in types, any(t != "nope" for t in types)
    theta, scaling = read_rope(hf, where, 500000.0)
    if scaling.startswith("yarn:"):
      raise UnsupportedArchitecture(
          f"{where}: RoPE scaling 'yarn' is not supported (only 'llama3' beside NoPE layers): use "
          "a checkpoint without it"
      )
    floor = hf["floor_scale"] if hf["attn_temperature_tuning"] and nope else 0
    if floor != int(floor) or floor < 0:
      raise UnsupportedArchitecture(
          f"{where}: floor_scale={floor!r} is not supported (a whole number of positions)"
      )
    qk_norm = bool(hf["use_qk_norm"]) and rope
    chunk = hf.get("attention_chunk_size")
    return dict(
        family="decoder",
        **decoder_shape(hf),
        positions="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        layer_types="" if set(types) == {"full"} else patterns.compress(types),
        attention_chunk=chunk if "chunked" in types else 0,
        attention_temperature_floor=int(floor),
        attention_temperature_scale=float(hf["attn_scale"]) if floor else 0.1,
        qk_norm=qk_norm,
        qk_norm_kind="l2" if qk_norm else "head",
        qk_norm_rope_only=qk_norm and nope,
        norm_placement="pre",
        norm="rmsnorm",
        norm_eps=hf["rms_norm_eps"],
        activation="swiglu",
        use_bias=False,
        feed_forward="moe",
        moe_impl="ragged",
        moe_dropless=True,
        moe_every=step,
        moe_dense_d_ff=hf["intermediate_size_mlp"],
        num_experts=hf["num_local_experts"],
        top_k=hf["num_experts_per_tok"],
        num_shared_experts=1,
        moe_score="sigmoid",
        router_norm_topk=False,
        moe_scale_input=True,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
        head="lm",
        dropout=0.0,
        attention_dropout=hf["attention_dropout"],
        init_std=hf["initializer_range"],
    )

  def hf_config(self, c, architecture):
    types = patterns.names(c, c.num_layers)
    rope = write_rope(c)
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ff_width,
        intermediate_size_mlp=c.dense_ff_width,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_width,
        hidden_act="silu",
        max_position_embeddings=c.max_len,
        initializer_range=c.init_std,
        rms_norm_eps=c.norm_eps,
        tie_word_embeddings=c.tie_embeddings,
        attention_dropout=c.attention_dropout,
        num_experts_per_tok=c.top_k,
        num_local_experts=c.num_experts,
        interleave_moe_layer_step=c.moe_every,
        moe_layers=[i for i in range(c.num_layers) if c.is_moe_layer(i)],
        use_qk_norm=c.qk_norm,
        no_rope_layers=[int(t != "nope") for t in types],
        attention_chunk_size=c.attention_chunk or None,
        layer_types=["chunked_attention" if t == "chunked" else "full_attention" for t in types],
        attn_temperature_tuning=bool(c.attention_temperature_floor),
        floor_scale=c.attention_temperature_floor or 8192,
        attn_scale=c.attention_temperature_scale,
        attention_bias=False,
        rope_parameters=dict(
            rope_theta=c.rope_theta, **(rope["rope_scaling"] or {"rope_type": "default"})
        ),
    )

  def rules(self, c, base):
    H, G, K = c.num_heads, c.kv_heads, c.head_width
    names = (("gate_proj", "wi_0"), ("up_proj", "wi_1"), ("down_proj", "wo"))

    def block(i, h, ours):
      attn, a, ffn, f = (
          ours + ("self_attn",),
          h + "self_attn.",
          ours + ("ffn",),
          h + "feed_forward.",
      )
      rules = linear(a + "q_proj", attn + ("query",), rows=rope_rows(0, K, H))
      rules += linear(a + "k_proj", attn + ("key",), rows=rope_rows(0, K, G))
      rules += linear(a + "v_proj", attn + ("value",))
      rules += linear(a + "o_proj", attn + ("out",), n_in=2)
      if not c.is_moe_layer(i):
        return rules + [r for hf_name, name in names for r in linear(f + hf_name, ffn + (name,))]
      rules += linear(f + "router", ffn + ("router",))
      rules += [
          Rule("gate_up_halves", (f + "experts.gate_up_proj",), (ffn + ("wi",), ffn + ("wi_1",))),
          Rule("copy", (f + "experts.down_proj",), (ffn + ("wo",),)),
      ]
      for hf_name, name in names:
        rules += linear(f + "shared_expert." + hf_name, ffn + ("shared", name))
      return rules

    return decoder_rules(c, base, block)

  def ignorable(self, c):
    return [r"lm_head\.weight"] if c.tie_embeddings else []

  def default_architecture(self, c):
    """A RoPE decoder whose experts take their weights on the way in is written as Llama 4."""
    if c.family == "decoder" and c.feed_forward == "moe" and c.moe_scale_input:
      return "Llama4ForCausalLM"
    return None

  def requirements(self, c, architecture):
    nope = any(t.rope == "none" for t in patterns.pattern(c))
    return dict(
        ROPE_DECODER,
        use_bias=False,
        feed_forward="moe",
        activation="swiglu",
        kv_heads=c.kv_heads,
        moe_every=c.moe_every,
        moe_dense_d_ff=c.moe_dense_d_ff,
        moe_score="sigmoid",
        router_norm_topk=False,
        moe_scale_input=True,
        num_shared_experts=1,
        rope_scaling=c.rope_scaling if c.rope_scaling.startswith("llama3:") else "",
        layer_types=c.layer_types,
        attention_chunk=c.attention_chunk,
        qk_norm=c.qk_norm,
        qk_norm_kind="l2" if c.qk_norm else "head",
        qk_norm_rope_only=c.qk_norm and nope,  # transformers never normalises a NoPE layer's
        attention_temperature_floor=c.attention_temperature_floor,
    )

  def check_exportable(self, c, architecture):
    """Layer types Llama 4 cannot hold: sliding ones, chunked ones without RoPE, or RoPE layers
    both chunked and full (transformers chunks every RoPE layer or none)."""
    kinds = {(t.attention, t.rope) for t in patterns.pattern(c)}
    rope = {("chunked", "global")} if c.attention_chunk else {("full", "global")}
    if kinds - rope - {("full", "none")}:
      raise UnsupportedConfig(
          f"cannot write model.layer_types={c.layer_types!r} as {architecture} (which needs "
          "chunked or full RoPE layers, not both, and NoPE ones): change the config or pick "
          "another architecture"
      )
