"""GPT-2 (GPT2LMHeadModel, GPT2Model) <-> the decoder family: pre-LN, learned positions, the
`lm` head tied to the token embedding unless tie_word_embeddings is false. GPT-2 stores its
projections as Conv1D ([in, out]) and q, k, v as one fused `c_attn`."""

from __future__ import annotations

from transformers_jax.interop.common import (
    ACTIVATIONS_OUT,
    Family,
    Rule,
    activation,
    dense,
    get,
    norm,
    require,
)


class GPT2(Family):
  model_type = "gpt2"
  architectures = {"GPT2LMHeadModel": ("lm",), "GPT2Model": ("lm",)}
  base_prefix = {"GPT2LMHeadModel": "transformer."}
  load_prefix = "transformer."
  defaults = dict(
      vocab_size=50257,
      n_positions=1024,
      n_embd=768,
      n_layer=12,
      n_head=12,
      n_inner=None,
      activation_function="gelu_new",
      resid_pdrop=0.1,
      attn_pdrop=0.1,
      layer_norm_epsilon=1e-5,
      initializer_range=0.02,
      tie_word_embeddings=True,
  )
  aliases = {  # GPT2Config's attribute_map
      "hidden_size": "n_embd",
      "max_position_embeddings": "n_positions",
      "num_attention_heads": "n_head",
      "num_hidden_layers": "n_layer",
  }
  summary_keys = ("n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "n_positions")

  def fields(self, hf, architecture, where):
    require(
        hf,
        where,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        add_cross_attention=False,
    )
    d = hf["n_embd"]
    return dict(
        family="decoder",
        num_layers=hf["n_layer"],
        d_model=d,
        num_heads=hf["n_head"],
        d_ff=get(hf, "n_inner", default=4 * d),
        vocab_size=hf["vocab_size"],
        max_len=hf["n_positions"],
        positions="learned",
        norm_placement="pre",
        norm="layernorm",
        norm_eps=hf["layer_norm_epsilon"],
        activation=activation(hf, "activation_function", where),
        use_bias=True,
        tie_embeddings=hf["tie_word_embeddings"],
        head="lm",
        dropout=hf["resid_pdrop"],
        attention_dropout=hf["attn_pdrop"],
        init_std=hf["initializer_range"],
    )

  def hf_config(self, c, architecture):
    eos = 50256 if c.vocab_size > 50256 else None  # GPT-2's bos/eos; a smaller vocab has none
    return dict(
        vocab_size=c.vocab_size,
        n_positions=c.max_len,
        n_embd=c.d_model,
        n_layer=c.num_layers,
        n_head=c.num_heads,
        n_inner=c.ff_width,
        activation_function=ACTIVATIONS_OUT[c.activation],
        layer_norm_epsilon=c.norm_eps,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attention_dropout,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=eos,
        eos_token_id=eos,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
    )

  def rules(self, c, base):
    rules = [
        Rule("copy", (base + "wte.weight",), (("embed", "token_embed", "embedding"),)),
        Rule("copy", (base + "wpe.weight",), (("embed", "pos_embed", "embedding"),)),
    ]
    qkv = ("query", "key", "value")
    for i in range(c.num_layers):
      h, ours = f"{base}h.{i}.", ("decoder", f"layer_{i}")
      attn = ours + ("self_attn",)
      rules += norm(h + "ln_1", ours + ("self_attn_norm",))
      rules.append(
          Rule(
              "fused_kernel", (h + "attn.c_attn.weight",), tuple(attn + (p, "kernel") for p in qkv)
          )
      )
      rules.append(
          Rule("fused_bias", (h + "attn.c_attn.bias",), tuple(attn + (p, "bias") for p in qkv))
      )
      rules += dense(h + "attn.c_proj", attn + ("out",), "conv1d", n_in=2)
      rules += norm(h + "ln_2", ours + ("ffn_norm",))
      rules += dense(h + "mlp.c_fc", ours + ("ffn", "wi"), "conv1d")
      rules += dense(h + "mlp.c_proj", ours + ("ffn", "wo"), "conv1d")
    rules += norm(base + "ln_f", ("final_norm",))
    if not c.tie_embeddings:
      rules.append(Rule("linear", ("lm_head.weight",), (("lm_head", "kernel"),)))
    return rules

  def ignorable(self, c):
    patterns = [r"h\.\d+\.attn\.(masked_)?bias"]  # old causal-mask buffers
    if c.tie_embeddings:
      patterns.append(r"lm_head\.weight")  # a tied copy of the token embedding
    return patterns

  def default_architecture(self, c):
    return "GPT2LMHeadModel" if c.family == "decoder" and c.positions == "learned" else None

  def requirements(self, c, architecture):
    want = dict(
        family="decoder",
        norm_placement="pre",
        has_final_norm=True,
        embed_norm=False,
        type_vocab_size=0,
    )
    if architecture == "GPT2Model":
      want["tie_embeddings"] = True  # GPT2Model has no lm_head to hold an untied unembedding
    return want
