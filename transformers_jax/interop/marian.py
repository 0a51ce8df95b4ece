"""Marian (MarianMTModel) <-> the encoder-decoder family: post-LN blocks with biases, fixed
sinusoidal positions laid out sines then cosines (`sinusoidal_halves`; not stored in the
files), embeddings scaled by sqrt(d_model) where scale_embedding says so, one vocabulary shared by
both stacks and tied to the softmax, and final_logits_bias, a buffer of zeros."""

from __future__ import annotations

import numpy as np

from transformers_jax.interop.common import (
    ACTIVATIONS_OUT,
    Family,
    Rule,
    UnsupportedArchitecture,
    activation,
    dense,
    norm,
    require,
)

BIAS = "final_logits_bias"


class Marian(Family):
  model_type = "marian"
  architectures = {"MarianMTModel": ("lm",)}
  base_prefix = {"MarianMTModel": "model."}
  load_prefix = "model."
  defaults = dict(
      vocab_size=58101,
      max_position_embeddings=1024,
      encoder_layers=12,
      encoder_ffn_dim=4096,
      encoder_attention_heads=16,
      decoder_layers=12,
      decoder_ffn_dim=4096,
      decoder_attention_heads=16,
      activation_function="gelu",
      d_model=1024,
      dropout=0.1,
      attention_dropout=0.0,
      init_std=0.02,
      scale_embedding=False,
      share_encoder_decoder_embeddings=True,
      tie_word_embeddings=True,
  )
  summary_keys = ("encoder_layers", "decoder_layers", "d_model", "encoder_ffn_dim", "vocab_size")

  def fields(self, hf, architecture, where):
    require(hf, where, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    heads, ffn = hf["decoder_attention_heads"], hf["decoder_ffn_dim"]
    return dict(
        family="encoder_decoder",
        num_layers=hf["encoder_layers"],
        num_encoder_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"],
        d_model=hf["d_model"],
        num_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        # the decoder's own heads and width where they differ (one Block class, two shapes)
        decoder_num_heads=None if heads == hf["encoder_attention_heads"] else heads,
        decoder_d_ff=None if ffn == hf["encoder_ffn_dim"] else ffn,
        vocab_size=hf["vocab_size"],
        max_len=hf["max_position_embeddings"],
        positions="sinusoidal_halves",
        norm_placement="post",
        norm="layernorm",
        norm_eps=1e-5,
        activation=activation(hf, "activation_function", where),
        use_bias=True,
        embed_scale=bool(hf["scale_embedding"]),
        tie_embeddings=True,
        share_embeddings=True,
        head="lm",
        dropout=hf["dropout"],
        attention_dropout=hf["attention_dropout"],
        init_std=hf["init_std"],
    )

  def hf_config(self, c, architecture):
    return dict(
        vocab_size=c.vocab_size,
        max_position_embeddings=c.max_len,
        d_model=c.d_model,
        encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers,
        encoder_attention_heads=c.num_heads,
        decoder_attention_heads=c.stack_config("decoder").num_heads,
        encoder_ffn_dim=c.ff_width,
        decoder_ffn_dim=c.stack_config("decoder").ff_width,
        activation_function=ACTIVATIONS_OUT[c.activation],
        scale_embedding=c.embed_scale,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        init_std=c.init_std,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        is_encoder_decoder=True,
        **self.token_ids(c),
    )

  def token_ids(self, c):
    """Marian's conventions (an export from a run with a tokenizer overrides the pad id)."""
    return dict(
        pad_token_id=c.vocab_size - 1,
        decoder_start_token_id=c.vocab_size - 1,
        eos_token_id=0,
        forced_eos_token_id=0,  # transformers' generate ends a row at max_new_tokens with it
    )

  def rules(self, c, base):
    rules = [Rule("copy", (base + "shared.weight",), (("embed", "token_embed", "embedding"),))]
    for stack, layers in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
      for i in range(layers):
        h, ours = f"{base}{stack}.layers.{i}.", (stack, f"layer_{i}")
        sublayers = [("self_attn", "self_attn")]
        if stack == "decoder":
          sublayers.append(("encoder_attn", "cross_attn"))
        for theirs, name in sublayers:
          for p, q in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            rules += dense(f"{h}{theirs}.{p}", ours + (name, q))
          rules += dense(f"{h}{theirs}.out_proj", ours + (name, "out"), n_in=2)
          rules += norm(f"{h}{theirs}_layer_norm", ours + (f"{name}_norm",))
        rules += dense(h + "fc1", ours + ("ffn", "wi"))
        rules += dense(h + "fc2", ours + ("ffn", "wo"))
        rules += norm(h + "final_layer_norm", ours + ("ffn_norm",))
    return rules

  def adjust_loaded(self, tensors, fields):
    """final_logits_bias is a buffer Marian keeps at zeros: read and let go (refused if not)."""
    if BIAS in tensors:
      if np.any(tensors.pop(BIAS)):
        raise UnsupportedArchitecture(
            f"{BIAS} holds values other than 0, which this model has no place for: export "
            "the model without it"
        )

  def adjust_saved(self, tensors, c):
    tensors[BIAS] = np.zeros((1, c.vocab_size), np.float32)

  def ignorable(self, c):
    # copies of the shared table; positions recomputed from the formula
    return [
        r"(encoder|decoder)\.embed_tokens\.weight",
        r"(encoder|decoder)\.embed_positions\.weight",
        r"lm_head\.weight",
    ]

  def default_architecture(self, c):
    if c.family == "encoder_decoder" and c.positions == "sinusoidal_halves":
      return "MarianMTModel"
    return None

  def requirements(self, c, architecture):
    return dict(
        family="encoder_decoder",
        positions="sinusoidal_halves",
        norm_placement="post",
        has_final_norm=False,
        embed_norm=False,
        embed_scale=c.embed_scale,
        share_embeddings=True,
        tie_embeddings=True,
        type_vocab_size=0,
        decoder_num_heads=c.decoder_num_heads,  # the decoder's own heads and width, any
        decoder_d_ff=c.decoder_d_ff,
    )
