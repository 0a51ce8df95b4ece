"""gpt-oss (GptOssForCausalLM) <-> the decoder family: pre-norm RMSNorm, grouped-query attention
with biases on q, k, v and the output and a sink logit per head (model.attention_sinks), banded
sliding-window blocks where config.json's layer_types say "sliding_attention" (every n-th
from the first: model.sliding_every), RoPE with YaRN scaling, and in every block a mixture of
experts: a router with a bias, the softmax over the top-k logits, clamped SwiGLU experts with
biases (activation swiglu_clamped, model.glu_alpha / glu_limit = swiglu_alpha / swiglu_limit).

Tensors: mlp.router.{weight, bias}; mlp.experts.gate_up_proj [E, D, 2F] (gate and up in
alternate columns), gate_up_proj_bias [E, 2F], down_proj [E, F, D], down_proj_bias [E, D];
self_attn.sinks [H]. The released files store the expert matrices in MXFP4
(gate_up_proj_blocks / _scales, down_proj_blocks / _scales; quantization_config mxfp4), read
into floating-point matrices one tensor at a time (interop/mxfp4.py); exports are floating-point.
"""

from __future__ import annotations

from transformers_jax.interop.common import (
    ROPE_DECODER,
    Family,
    Rule,
    UnsupportedArchitecture,
    decoder_rules,
    decoder_shape,
    dense,
    require,
)
from transformers_jax.interop.mxfp4 import packed_experts
from transformers_jax.interop.rope_scaling import read_rope, write_rope

# What GptOssConfig assumes for a key config.json leaves out.
YARN = dict(
    rope_type="yarn",
    factor=32.0,
    beta_fast=32.0,
    beta_slow=1.0,
    truncate=False,
    original_max_position_embeddings=4096,
)


def sliding_period(layer_types, layers: int, where: str) -> int:
  """n of model.sliding_every when config.json's layer_types slide on layers 0, n, 2n, ... (0:
  none slides); an error naming layer_types for any other pattern."""
  sliding = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
  others = {kind for kind in layer_types} - {"sliding_attention", "full_attention"}
  if len(layer_types) != layers or others:
    raise UnsupportedArchitecture(
        f"{where}: layer_types must list sliding_attention or full_attention for each of the "
        f"{layers} layers: use the config.json saved with the weights"
    )
  if not sliding:
    return 0
  for n in range(1, layers + 1):
    if sliding == list(range(0, layers, n)):
      return n
  raise UnsupportedArchitecture(
      f"{where}: layer_types sliding on layers {sliding} is not supported (only every n-th layer "
      "from the first slides here, model.sliding_every): use a checkpoint without it"
  )


def layer_types(c) -> list[str]:
  """config.json's layer_types of `c`: sliding where model.sliding_every puts the window."""
  slides = [bool(c.sliding_window) and i % c.sliding_every == 0 for i in range(c.num_layers)]
  return ["sliding_attention" if s else "full_attention" for s in slides]


class GptOss(Family):
  model_type = "gpt_oss"
  architectures = {"GptOssForCausalLM": ("lm",)}
  base_prefix = {"GptOssForCausalLM": "model."}
  load_prefix = "model."
  explicit_head_dim = True
  aliases = {"experts_per_token": "num_experts_per_tok"}  # the released files carry both
  defaults = dict(
      num_hidden_layers=36,
      num_local_experts=128,
      vocab_size=201088,
      hidden_size=2880,
      intermediate_size=2880,
      head_dim=64,
      num_attention_heads=64,
      num_key_value_heads=8,
      sliding_window=128,
      tie_word_embeddings=False,
      initializer_range=0.02,
      max_position_embeddings=131072,
      rms_norm_eps=1e-5,
      attention_dropout=0.0,
      num_experts_per_tok=4,
      swiglu_alpha=1.702,
      swiglu_limit=7.0,
      attention_bias=True,
  )
  summary_keys = (
      "num_hidden_layers",
      "hidden_size",
      "num_attention_heads",
      "num_key_value_heads",
      "head_dim",
      "intermediate_size",
      "num_local_experts",
      "vocab_size",
  )

  def fields(self, hf, architecture, where):
    method = (hf.get("quantization_config") or {}).get("quant_method")
    if hf.get("quantization_config") and method != "mxfp4":
      raise UnsupportedArchitecture(
          f"{where}: quantization_config ({method!r}) is not read (only gpt-oss's released "
          "mxfp4 experts are): use a floating-point checkpoint"
      )
    require(hf, where, attention_bias=True)  # one use_bias: the experts' biases are always there
    layers = hf["num_hidden_layers"]
    alternate = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    every = sliding_period(hf.get("layer_types") or alternate, layers, where)
    if every and not hf.get("sliding_window"):
      raise UnsupportedArchitecture(
          f"{where}: sliding_window={hf.get('sliding_window')!r} but layer_types slide: give "
          "the window's length"
      )
    theta, scaling = read_rope(hf, where, 150000.0, YARN)
    return dict(
        family="decoder",
        **decoder_shape(hf),
        positions="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        norm_placement="pre",
        norm="rmsnorm",
        norm_eps=hf["rms_norm_eps"],
        activation="swiglu_clamped",
        glu_alpha=float(hf["swiglu_alpha"]),
        glu_limit=float(hf["swiglu_limit"]),
        use_bias=True,
        attention_sinks=True,
        sliding_window=hf["sliding_window"] if every else 0,
        sliding_every=every or 1,
        feed_forward="moe",
        moe_impl="ragged",
        moe_dropless=True,
        num_experts=hf["num_local_experts"],
        top_k=hf["num_experts_per_tok"],
        router_bias=True,
        router_norm_topk=True,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
        head="lm",
        dropout=0.0,
        attention_dropout=hf["attention_dropout"],
        init_std=hf["initializer_range"],
    )

  def hf_config(self, c, architecture):
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ff_width,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_width,
        num_local_experts=c.num_experts,
        num_experts_per_tok=c.top_k,
        max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps,
        # transformers builds the sliding mask whether or not a layer reads it: a length it takes
        sliding_window=c.sliding_window or c.max_len,
        layer_types=layer_types(c),
        swiglu_alpha=c.glu_alpha,
        swiglu_limit=c.glu_limit,
        attention_bias=True,
        tie_word_embeddings=c.tie_embeddings,
        initializer_range=c.init_std,
        attention_dropout=c.attention_dropout,
        **write_rope(c, none={"rope_type": "default"}),  # (else GptOssConfig assumes YaRN)
    )

  def rules(self, c, base):
    def block(i, h, ours):
      attn, ffn, rules = ours + ("self_attn",), ours + ("ffn",), []
      for hf_name, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
        rules += dense(h + "self_attn." + hf_name, attn + (name,))  # weight and bias
      rules += dense(h + "self_attn.o_proj", attn + ("out",), n_in=2)
      rules.append(Rule("copy", (h + "self_attn.sinks",), (attn + ("sinks",),)))
      rules += dense(h + "mlp.router", ffn + ("router",))
      experts = h + "mlp.experts."
      rules += [
          Rule("gate_up", (experts + "gate_up_proj",), (ffn + ("wi",), ffn + ("wi_1",))),
          Rule("gate_up_bias", (experts + "gate_up_proj_bias",), (ffn + ("bi",), ffn + ("bi_1",))),
          Rule("copy", (experts + "down_proj",), (ffn + ("wo",),)),
          Rule("expert_bias", (experts + "down_proj_bias",), (ffn + ("bo",),)),
      ]
      return rules

    return decoder_rules(c, base, block)

  def adjust_loaded(self, tensors, fields):
    packed_experts(tensors)  # the released files' MXFP4 experts, dequantized as they are taken

  def ignorable(self, c):
    return [r"lm_head\.weight"] if c.tie_embeddings else []

  def default_architecture(self, c):
    """A RoPE decoder with attention sinks and experts is written as gpt-oss."""
    if c.family == "decoder" and c.attention_sinks and c.feed_forward == "moe":
      return "GptOssForCausalLM"
    return None

  def requirements(self, c, architecture):
    return dict(
        ROPE_DECODER,
        use_bias=True,
        qkv_bias=(None, True),
        attention_sinks=True,
        feed_forward="moe",
        moe_every=1,
        activation="swiglu_clamped",
        router_bias=True,
        router_norm_topk=True,
        kv_heads=c.kv_heads,
        rope_scaling=c.rope_scaling,  # none, yarn or llama3, all written
        sliding_window=c.sliding_window,
    )
