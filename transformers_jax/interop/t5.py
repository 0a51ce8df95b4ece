"""T5 and T5 v1.1 (T5ForConditionalGeneration) <-> the encoder-decoder family: pre-norm RMSNorm
without bias, no biases, one relative-position bias table per stack (held by its first layer in
Hugging Face's files), unscaled attention scores, a ReLU ("relu") or gated tanh-GELU
("gated-gelu") feed-forward, one vocabulary shared by both stacks, and the unembedding tied (v1.0:
reading the decoder output times d_model^-1/2) or not (v1.1)."""

from __future__ import annotations

from transformers_jax.interop.common import Family, Rule, UnsupportedArchitecture

FEED_FORWARDS = {"relu": "relu", "gated-gelu": "geglu_tanh"}
FEED_FORWARDS_OUT = {v: k for k, v in FEED_FORWARDS.items()}


class T5(Family):
  model_type = "t5"
  architectures = {"T5ForConditionalGeneration": ("lm",)}
  explicit_head_dim = True  # d_kv: 3B and 11B have heads x d_kv != d_model
  defaults = dict(
      vocab_size=32128,
      d_model=512,
      d_kv=64,
      d_ff=2048,
      num_layers=6,
      num_decoder_layers=None,
      num_heads=8,
      relative_attention_num_buckets=32,
      relative_attention_max_distance=128,
      dropout_rate=0.1,
      layer_norm_epsilon=1e-6,
      initializer_factor=1.0,
      feed_forward_proj="relu",
      tie_word_embeddings=True,
  )
  summary_keys = ("num_layers", "num_decoder_layers", "d_model", "num_heads", "d_kv", "d_ff")

  def fields(self, hf, architecture, where):
    proj = hf["feed_forward_proj"]
    if proj not in FEED_FORWARDS:
      raise UnsupportedArchitecture(
          f"{where}: feed_forward_proj={proj!r} is not supported: use one of "
          f"{', '.join(FEED_FORWARDS)}"
      )
    d, heads, d_kv = hf["d_model"], hf["num_heads"], hf["d_kv"]
    tied = hf["tie_word_embeddings"] is not False
    # transformers 5 always ties the unembedding and says whether it scales; the hub's files
    # (and transformers 4) say tie_word_embeddings: false for T5 v1.1's unscaled, untied head.
    # Whether the head is tied is then read off the tensors (adjust_loaded).
    scale = hf.get("scale_decoder_outputs", tied)
    return dict(
        family="encoder_decoder",
        num_layers=hf["num_layers"],
        num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf["num_decoder_layers"] or hf["num_layers"],
        d_model=d,
        num_heads=heads,
        head_dim=None if heads * d_kv == d else d_kv,
        d_ff=hf["d_ff"],
        vocab_size=hf["vocab_size"],
        max_len=max(512, int(hf.get("n_positions") or 512)),  # relative: no table bounds it
        positions="t5",
        relative_buckets=hf["relative_attention_num_buckets"],
        relative_max_distance=hf["relative_attention_max_distance"],
        norm_placement="pre",
        norm="rmsnorm",
        norm_eps=hf["layer_norm_epsilon"],
        activation=FEED_FORWARDS[proj],
        use_bias=False,
        scale_scores=False,
        tie_embeddings=tied,
        unembed_scale=bool(scale),
        share_embeddings=True,
        head="lm",
        dropout=hf["dropout_rate"],
        init_std=hf["initializer_factor"] * d**-0.5,
    )

  def hf_config(self, c, architecture):
    return dict(
        vocab_size=c.vocab_size,
        d_model=c.d_model,
        d_kv=c.head_width,
        d_ff=c.ff_width,
        num_layers=c.encoder_layers,
        num_decoder_layers=c.decoder_layers,
        num_heads=c.num_heads,
        relative_attention_num_buckets=c.relative_buckets,
        relative_attention_max_distance=c.relative_max_distance,
        dropout_rate=c.dropout,
        layer_norm_epsilon=c.norm_eps,
        feed_forward_proj=FEED_FORWARDS_OUT[c.activation],
        # what transformers 5 reads as scale_decoder_outputs (and 4 as tying and scaling)
        tie_word_embeddings=c.unembed_scale,
        initializer_factor=round(c.init_std * c.d_model**0.5, 12),  # as read: exact again
        is_encoder_decoder=True,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )

  def rules(self, c, base):
    def linear(hf, path, n_in=1):
      return Rule("linear", (hf + ".weight",), (path + ("kernel",),), n_in)

    def attention(hf, path):
      rules = [
          linear(f"{hf}.{p}", path + (name,)) for p, name in zip("qkv", ("query", "key", "value"))
      ]
      return rules + [linear(f"{hf}.o", path + ("out",), n_in=2)]

    def norm(hf, path):
      return Rule("copy", (hf + ".weight",), (path + ("scale",),))

    ffn_in = ("wi_0", "wi_1") if c.gated else ("wi",)
    rules = [Rule("copy", ("shared.weight",), (("embed", "token_embed", "embedding"),))]
    for stack, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
      bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
      rules.append(Rule("copy", (bias,), ((stack, "relative_bias"),)))
      for i in range(layers):
        h, ours = f"{stack}.block.{i}.layer.", (stack, f"layer_{i}")
        rules += attention(h + "0.SelfAttention", ours + ("self_attn",))
        rules.append(norm(h + "0.layer_norm", ours + ("self_attn_norm",)))
        ffn = h + ("1" if stack == "encoder" else "2")
        if stack == "decoder":
          rules += attention(h + "1.EncDecAttention", ours + ("cross_attn",))
          rules.append(norm(h + "1.layer_norm", ours + ("cross_attn_norm",)))
        rules += [linear(f"{ffn}.DenseReluDense.{n}", ours + ("ffn", n)) for n in (*ffn_in, "wo")]
        rules.append(norm(ffn + ".layer_norm", ours + ("ffn_norm",)))
      rules.append(norm(f"{stack}.final_layer_norm", (f"{stack}_norm",)))
    if not c.tie_embeddings:
      rules.append(linear("lm_head", ("lm_head",)))
    return rules

  def adjust_loaded(self, tensors, fields):
    """An lm_head.weight other than shared.weight is an untied head, whatever config.json says;
    one equal to it (a saved copy) is the tied one."""
    import numpy as np

    head = tensors.get("lm_head.weight")
    fields["tie_embeddings"] = head is None or np.array_equal(head, tensors.get("shared.weight"))

  def ignorable(self, c):
    patterns = [r"(encoder|decoder)\.embed_tokens\.weight"]  # copies of shared.weight
    if c.tie_embeddings:
      patterns.append(r"lm_head\.weight")
    return patterns

  def default_architecture(self, c):
    if c.family == "encoder_decoder" and c.positions == "t5":
      return "T5ForConditionalGeneration"
    return None

  def requirements(self, c, architecture):
    return dict(
        family="encoder_decoder",
        norm_placement="pre",
        has_final_norm=True,
        embed_norm=False,
        positions="t5",
        norm="rmsnorm",
        has_norm_bias=False,
        use_bias=False,
        activation=tuple(FEED_FORWARDS_OUT),
        scale_scores=False,
        unembed_scale=c.unembed_scale,
        share_embeddings=True,
    )
