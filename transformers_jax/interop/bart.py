"""BART (BartForConditionalGeneration) <-> the encoder-decoder family: Marian's post-LN blocks
with biases (interop/marian.py), but exact GELU, unscaled embeddings and, per stack, a learned
position table whose first two rows are never read (position p reads row p + 2) and a LayerNorm
right after the embeddings (model.stack_embeddings, model.position_offset=2). One token table,
tied to the softmax; final_logits_bias is a buffer of zeros."""

from __future__ import annotations

from transformers_jax.interop.common import Rule, norm
from transformers_jax.interop.marian import Marian

# BartLearnedPositionalEmbedding's rows before position 0
OFFSET = 2


class Bart(Marian):
  model_type = "bart"
  architectures = {"BartForConditionalGeneration": ("lm",)}
  base_prefix = {"BartForConditionalGeneration": "model."}
  defaults = dict(Marian.defaults, vocab_size=50265, scale_embedding=False)

  def fields(self, hf, architecture, where):
    return dict(
        super().fields(hf, architecture, where),
        positions="learned",
        position_offset=OFFSET,
        stack_embeddings=True,
        embed_norm=True,
    )

  def hf_config(self, c, architecture):
    out = super().hf_config(c, architecture)
    del out["share_encoder_decoder_embeddings"]  # Marian's key
    return out

  def token_ids(self, c):
    """BART's conventions (an export from a run with a tokenizer overrides the pad id)."""
    return dict(
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )

  def rules(self, c, base):
    rules = super().rules(c, base)
    for stack, ours in (("encoder", "src_embed"), ("decoder", "embed")):
      table = (ours, "pos_embed", "embedding")
      rules.append(Rule("copy", (f"{base}{stack}.embed_positions.weight",), (table,)))
      rules += norm(f"{base}{stack}.layernorm_embedding", (ours, "embed_norm"))
    return rules

  def ignorable(self, c):
    # copies of the shared table
    return [r"(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight"]

  def default_architecture(self, c):
    if c.family == "encoder_decoder" and c.stack_embeddings:
      return "BartForConditionalGeneration"
    return None

  def requirements(self, c, architecture):
    return dict(
        super().requirements(c, architecture),
        positions="learned",
        position_offset=OFFSET,
        stack_embeddings=True,
        embed_norm=True,
    )
