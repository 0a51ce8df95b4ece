"""BERT (BertModel, BertForMaskedLM) <-> the encoder family: post-LN with the embedding norm,
token types, the `pooler` or `mlm` head. Original Google checkpoints' LayerNorm gamma/beta names
are read too."""

from __future__ import annotations

from transformers_jax.interop.common import (
    ENCODER_DEFAULTS,
    ENCODER_SUMMARY_KEYS,
    Family,
    Rule,
    UnsupportedConfig,
    dense,
    encoder_fields,
    encoder_hf_config,
    encoder_layer_rules,
    norm,
    require,
)

# The MLM output bias: `cls.predictions.bias`, which the decoder shares when tied; an untied
# decoder (tie_word_embeddings=False) has its own `decoder.bias`, the one its logits use.
BIAS, DECODER_BIAS = "cls.predictions.bias", "cls.predictions.decoder.bias"


class BERT(Family):
  model_type = "bert"
  architectures = {"BertModel": ("pooler",), "BertForMaskedLM": ("mlm",)}
  base_prefix = {"BertForMaskedLM": "bert."}
  load_prefix = "bert."
  defaults = dict(
      ENCODER_DEFAULTS,
      vocab_size=30522,
      hidden_dropout_prob=0.1,
      attention_probs_dropout_prob=0.1,
      max_position_embeddings=512,
      type_vocab_size=2,
      tie_word_embeddings=True,
  )
  summary_keys = (
      *ENCODER_SUMMARY_KEYS,
      *("vocab_size", "max_position_embeddings", "type_vocab_size"),
  )

  def fields(self, hf, architecture, where):
    require(
        hf, where, position_embedding_type="absolute", is_decoder=False, add_cross_attention=False
    )
    return dict(
        encoder_fields(hf, where),
        family="encoder",
        vocab_size=hf["vocab_size"],
        max_len=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"],
        norm_placement="post",
        embed_norm=True,
        tie_embeddings=hf["tie_word_embeddings"],
        head="mlm" if architecture == "BertForMaskedLM" else "pooler",
    )

  def hf_config(self, c, architecture):
    return dict(
        encoder_hf_config(c),
        vocab_size=c.vocab_size,
        max_position_embeddings=c.max_len,
        type_vocab_size=c.type_vocab_size,
        tie_word_embeddings=c.tie_embeddings,
        position_embedding_type="absolute",
        is_decoder=False,
        pad_token_id=0,  # transformers' default; convert writes the run tokenizer's
    )

  def rules(self, c, base):
    e = base + "embeddings."
    rules = [
        Rule("copy", (e + "word_embeddings.weight",), (("embed", "token_embed", "embedding"),)),
        Rule("copy", (e + "position_embeddings.weight",), (("embed", "pos_embed", "embedding"),)),
        Rule(
            "copy", (e + "token_type_embeddings.weight",), (("embed", "type_embed", "embedding"),)
        ),
    ]
    rules += norm(e + "LayerNorm", ("embed", "embed_norm"))
    rules += encoder_layer_rules(
        c, base, "attention.self.", ("attention.output.LayerNorm", "output.LayerNorm")
    )
    if c.head_kind == "pooler":
      rules += dense(base + "pooler.dense", ("pooler",))
    if c.head_kind == "mlm":
      rules += dense("cls.predictions.transform.dense", ("mlm_transform",))
      rules += norm("cls.predictions.transform.LayerNorm", ("mlm_norm",))
      rules.append(Rule("copy", (BIAS,), (("mlm_bias",),)))
      if not c.tie_embeddings:
        rules.append(
            Rule("linear", ("cls.predictions.decoder.weight",), (("mlm_decoder", "kernel"),))
        )
    return rules

  def ignorable(self, c):
    # the position_ids buffer, the next-sentence head, the pooler of a BertForPreTraining
    # checkpoint read as BertForMaskedLM, the tied copies of the token embedding and bias
    patterns = [r"embeddings\.position_ids", r"cls\.seq_relationship\..*"]
    if c.head_kind == "mlm":
      patterns += [r"pooler\.dense\.(weight|bias)", r"cls\.predictions\.decoder\.bias"]
    if c.tie_embeddings:
      patterns.append(r"cls\.predictions\.decoder\.weight")
    return patterns

  def default_architecture(self, c):
    if c.family != "encoder":
      return None
    return {"pooler": "BertModel", "mlm": "BertForMaskedLM"}.get(c.head_kind)

  def requirements(self, c, architecture):
    return dict(family="encoder", norm_placement="post", has_final_norm=False, embed_norm=True)

  def check_exportable(self, c, architecture):
    if c.type_vocab_size < 1:
      raise UnsupportedConfig(
          f"cannot write model.type_vocab_size=0 as {architecture}: BERT always has token "
          "types; set model.type_vocab_size >= 1"
      )

  def adjust_loaded(self, tensors, fields):
    untied = not fields.get("tie_embeddings", True)
    if DECODER_BIAS in tensors and (untied or BIAS not in tensors):
      tensors[BIAS] = tensors.pop(DECODER_BIAS)

  def adjust_saved(self, tensors, c):
    if BIAS in tensors and not c.tie_embeddings:  # what an untied decoder adds
      tensors[DECODER_BIAS] = tensors[BIAS].copy()
