"""Llama (LlamaForCausalLM), Mistral (MistralForCausalLM, with its sliding window), Mixtral
(MixtralForCausalLM, its experts) and Qwen2 (Qwen2ForCausalLM) <-> the decoder family: pre-norm
RMSNorm, RoPE (Llama 3.1's "llama3" and linear scaling included), SwiGLU, grouped-query
attention, Llama's optional biases (attention_bias on q, k, v and o, mlp_bias on the
feed-forward), Qwen2's on q/k/v, the `lm` head untied unless tie_word_embeddings. They share
their tensor names (Mixtral's experts apart); config.json is read both as the hub's files write
it (`rope_theta`, `rope_scaling`) and as transformers 5.x does (`rope_parameters`).
"""

from __future__ import annotations

from transformers_jax.interop.common import (
    PRE_NORMS,
    ROPE_DECODER,
    Family,
    Rule,
    UnsupportedArchitecture,
    decoder_rules,
    decoder_shape,
    linear,
    require,
)
from transformers_jax.modules import layer_types
from transformers_jax.modules.positions import linear_rope_factor, parse_rope_scaling
from transformers_jax.modules.yarn import parse_yarn


def _rope(hf, where: str) -> tuple[float, str]:
  """(rope_theta, model.rope_scaling) from either way of writing them."""
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  return rope_values(rope, hf.get("rope_theta", 10000.0), where)


def rope_values(rope, theta, where: str, what: str = "RoPE scaling") -> tuple[float, str]:
  """(theta, model.rope_scaling) of one rope_parameters entry (`theta` where it has none)."""
  theta = float(rope.get("rope_theta", theta))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind == "default":
    return theta, ""
  if kind == "linear":
    return theta, "linear:" + format(float(rope["factor"]), ".12g")
  if kind != "llama3":
    raise UnsupportedArchitecture(
        f"{where}: {what} {kind!r} is not supported (only 'llama3', Llama 3.1's, and "
        "'linear'): use a checkpoint without it"
    )
  numbers = [
      rope["factor"],
      rope["low_freq_factor"],
      rope["high_freq_factor"],
      rope["original_max_position_embeddings"],
  ]
  return theta, "llama3:" + ",".join(format(float(x), ".12g") for x in numbers)


def rope_parameters(theta: float, scaling: str) -> dict:
  """A rope_parameters entry (transformers' names) of RoPE at `theta` with model.rope_scaling."""
  out = dict(rope_type="default", rope_theta=theta)
  if linear_rope_factor(scaling):
    out.update(rope_type="linear", factor=linear_rope_factor(scaling))
  elif scaling:
    factor, low, high, original = parse_rope_scaling(scaling)
    out.update(
        rope_type="llama3",
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    )
  return out


class Llama(Family):
  model_type = "llama"
  architectures = {"LlamaForCausalLM": ("lm",)}
  base_prefix = {"LlamaForCausalLM": "model."}
  load_prefix = "model."
  qkv_bias = False  # Qwen2 has biases on q, k and v
  # the bias switches config.json has, read and written (Llama's both; others none or one)
  biases = ("attention_bias", "mlp_bias")
  activation = ("swiglu", "silu")  # (ours, config.json's hidden_act)
  gemma = False  # Gemma: embeddings times sqrt(d_model), norms applying 1 + w, tied
  feed_forward = "dense"  # Mixtral: moe
  # each block's norms: (Hugging Face's name, ours); pre-norm, one before each sublayer
  norms = PRE_NORMS
  explicit_head_dim = True  # config.json's head_dim may differ from hidden_size / heads
  # the config class's special ids: one outside a smaller vocabulary is written as null
  # (transformers refuses a padding id outside it); a converted run's tokenizer overrides them
  token_defaults = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2)
  defaults = dict(
      vocab_size=32000,
      hidden_size=4096,
      intermediate_size=11008,
      num_hidden_layers=32,
      num_attention_heads=32,
      num_key_value_heads=None,
      hidden_act="silu",
      max_position_embeddings=2048,
      initializer_range=0.02,
      rms_norm_eps=1e-6,
      tie_word_embeddings=False,
      attention_dropout=0.0,
  )
  summary_keys = (
      "num_hidden_layers",
      "hidden_size",
      "num_attention_heads",
      "num_key_value_heads",
      "intermediate_size",
      "vocab_size",
  )

  def check(self, hf, where):
    require(hf, where, hidden_act=self.activation[1])
    require(hf, where, **{k: False for k in ("attention_bias", "mlp_bias") if k not in self.biases})

  def fields(self, hf, architecture, where):
    self.check(hf, where)
    theta, scaling = _rope(hf, where)
    shape = decoder_shape(hf)
    if shape["head_dim"] * shape["num_heads"] == shape["d_model"]:
      shape["head_dim"] = None  # (the default)
    attention_bias = "attention_bias" in self.biases and bool(hf.get("attention_bias"))
    mlp_bias = "mlp_bias" in self.biases and bool(hf.get("mlp_bias"))
    return dict(
        family="decoder",
        **shape,
        positions="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        norm_placement="pre",
        norm="rmsnorm",
        norm_eps=hf["rms_norm_eps"],
        activation=self.activation[0],
        embed_scale=self.gemma,
        norm_unit_offset=self.gemma,
        use_bias=attention_bias,  # q, k, v and o
        ffn_bias=None if mlp_bias == attention_bias else mlp_bias,
        qkv_bias=True if self.qkv_bias else None,
        sliding_window=0,  # Mistral's own
        tie_embeddings=bool(hf["tie_word_embeddings"]),
        head="lm",
        dropout=0.0,
        attention_dropout=hf["attention_dropout"],
        init_std=hf["initializer_range"],
    )

  def hf_config(self, c, architecture):
    rope = None
    if c.rope_scaling:
      rope = rope_parameters(c.rope_theta, c.rope_scaling)
      del rope["rope_theta"]
    out = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ff_width,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_width,
        hidden_act=self.activation[1],
        max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta,
        rope_scaling=rope,
        tie_word_embeddings=c.tie_embeddings,
        initializer_range=c.init_std,
        attention_dropout=c.attention_dropout,
    )
    for key, default in self.token_defaults.items():
      if default is not None and default >= c.vocab_size:
        out[key] = None
    if self.biases:
      values = dict(attention_bias=c.use_bias, mlp_bias=c.has_ffn_bias)
      out.update({k: values[k] for k in self.biases})
    elif not self.qkv_bias:
      out.update(attention_bias=False, mlp_bias=False)
    return out

  def rules(self, c, base):
    def block(i, h, ours):
      attn = self.attention_rules(c, h + "self_attn.", ours + ("self_attn",))
      return attn + self.ffn_rules(c, h, ours + ("ffn",))

    return decoder_rules(c, base, block, norms=self.norms)

  def attention_rules(self, c, h: str, attn: tuple[str, ...]) -> list[Rule]:
    qkv_bias = c.use_bias if c.qkv_bias is None else c.qkv_bias
    rules = []
    for hf_name, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
      rules += linear(h + hf_name, attn + (name,), bias=qkv_bias)
    return rules + linear(h + "o_proj", attn + ("out",), bias=c.use_bias, n_in=2)

  def ffn_rules(self, c, h: str, ffn: tuple[str, ...]) -> list[Rule]:
    rules = []
    for hf_name, name in (("gate_proj", "wi_0"), ("up_proj", "wi_1"), ("down_proj", "wo")):
      rules += linear(h + "mlp." + hf_name, ffn + (name,), bias=c.has_ffn_bias)
    return rules

  def ignorable(self, c):
    patterns = [r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq"]  # old checkpoints' buffers
    if c.tie_embeddings:
      patterns.append(r"lm_head\.weight")  # a tied copy of the token embedding
    return patterns

  def default_architecture(self, c):
    """A RoPE decoder is written as Llama: as Qwen2 with q/k/v biases, Gemma with (1 + w) norms
    (Gemma 3 with q/k norms or per-layer patterns), OLMo 2 with the reordered norm (OLMo 3 with
    sliding layers), Qwen3 with q/k norms, SmolLM3 with NoPE layers, Mixtral with experts,
    Mistral with a sliding window (Phi-3 when asked for)."""
    if c.family != "decoder" or c.positions != "rope":
      return None
    names = set(layer_types.names(c, c.num_layers))
    if c.norm_unit_offset:
      if c.qk_norm or c.layer_types or c.rope_local_theta:
        return "Gemma3ForCausalLM"
      return "Gemma2ForCausalLM" if c.norm_placement == "sandwich" else "GemmaForCausalLM"
    if c.norm_placement == "reordered":
      return "Olmo3ForCausalLM" if "sliding" in names else "Olmo2ForCausalLM"
    if c.qk_norm:
      return "Qwen3ForCausalLM"
    if names & {"nope", "sliding_nope"}:
      return "SmolLM3ForCausalLM"
    if c.feed_forward == "moe":
      return "MixtralForCausalLM"
    if c.sliding_window:
      return "MistralForCausalLM"
    return "Qwen2ForCausalLM" if c.qkv_bias else "LlamaForCausalLM"

  def requirements(self, c, architecture):
    return dict(
        ROPE_DECODER,
        use_bias=c.use_bias if "attention_bias" in self.biases else False,
        has_ffn_bias=c.has_ffn_bias if "mlp_bias" in self.biases else False,
        qkv_bias=(True,) if self.qkv_bias else (None, c.use_bias),
        feed_forward=self.feed_forward,
        kv_heads=c.kv_heads,  # any grouping
        activation=self.activation[0],
        embed_scale=self.gemma,
        norm_unit_offset=self.gemma,
        # none, llama3 or linear, each written; YaRN is not Llama's (gpt_oss, qwen3_moe,
        # deepseek_v3)
        rope_scaling=c.rope_scaling if not parse_yarn(c.rope_scaling) else "",
    )


class Mistral(Llama):
  model_type = "mistral"
  architectures = {"MistralForCausalLM": ("lm",)}
  base_prefix = {"MistralForCausalLM": "model."}
  defaults = dict(
      Llama.defaults,
      intermediate_size=14336,
      num_key_value_heads=8,
      max_position_embeddings=32768,
      rms_norm_eps=1e-6,
      sliding_window=None,
  )

  biases = ()  # MistralConfig has no attention_bias or mlp_bias

  def check(self, hf, where):
    require(hf, where, hidden_act="silu")

  def fields(self, hf, architecture, where):
    window = hf.get("sliding_window")  # Mistral 7B v0.1: 4,096; v0.2 and later: none
    window = window if window is not None and window < hf["max_position_embeddings"] else 0
    return dict(super().fields(hf, architecture, where), sliding_window=window)

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    del out["attention_bias"], out["mlp_bias"]
    return dict(out, sliding_window=c.sliding_window or None)

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture), sliding_window=c.sliding_window, sliding_every=1
    )


class Qwen2(Llama):
  model_type = "qwen2"
  architectures = {"Qwen2ForCausalLM": ("lm",)}
  base_prefix = {"Qwen2ForCausalLM": "model."}
  qkv_bias = True
  biases = ()
  defaults = dict(
      Llama.defaults,
      vocab_size=151936,
      intermediate_size=22016,
      num_key_value_heads=32,
      max_position_embeddings=32768,
      use_sliding_window=False,
  )

  def check(self, hf, where):
    require(hf, where, hidden_act="silu", use_sliding_window=False)

  def hf_config(self, c, architecture):
    return dict(super().hf_config(c, architecture), use_sliding_window=False)


class Mixtral(Mistral):
  """Mixtral (MixtralForCausalLM): Mistral's attention with a sparse mixture of SwiGLU experts
  (block_sparse_moe: a router, and w1 gate, w3 up, w2 down per expert), top-k routed with the
  chosen probabilities renormalised, every token computed (moe_impl ragged, dropless)."""

  model_type = "mixtral"
  architectures = {"MixtralForCausalLM": ("lm",)}
  base_prefix = {"MixtralForCausalLM": "model."}
  feed_forward = "moe"
  defaults = dict(Mistral.defaults, num_local_experts=8, num_experts_per_tok=2)
  summary_keys = Llama.summary_keys + ("num_local_experts",)

  def fields(self, hf, architecture, where):
    return dict(
        super().fields(hf, architecture, where),
        feed_forward="moe",
        moe_impl="ragged",
        moe_dropless=True,
        num_experts=hf["num_local_experts"],
        top_k=hf["num_experts_per_tok"],
    )

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    return dict(out, num_local_experts=c.num_experts, num_experts_per_tok=c.top_k)

  def ffn_rules(self, c, h, ffn):
    moe = h + "block_sparse_moe."
    rules = [Rule("linear", (moe + "gate.weight",), (ffn + ("router", "kernel"),))]
    for hf_name, name in (("w1", "wi"), ("w3", "wi_1"), ("w2", "wo")):
      names = tuple(f"{moe}experts.{e}.{hf_name}.weight" for e in range(c.num_experts))
      rules.append(Rule("experts", names, (ffn + (name,),)))
    return rules

  def requirements(self, c, architecture):
    return dict(super().requirements(c, architecture), moe_every=1)
