"""FLOPs per token, and param_count's summary of a config's counts and FLOPs.

FLOPs convention (PaLM, Chowdhery et al. 2022, appendix B): training FLOPs per token
    6 * N + 12 * sum over attention layers of (H * K * keys attended)
where N counts the weights multiplied per token — the active parameters of every block plus the
output projection (unembedding, tied or not, and heads) — and excludes embedding *lookups*
(token, position, token-type tables), which cost no matmul. For MoE only the router and top_k
experts count. The attention term is 6 * 2 * H*K*S per layer (q.k and weights.v, forward and
backward); causal masking is not discounted, as in the paper.
"""

from __future__ import annotations

from transformers_jax.models import as_model_config, param_shapes
from transformers_jax.models.counting import (
    analytic_breakdown,
    analytic_count,
    lora_count,
    ordered,
    state_count,
    tree_breakdown,
)
from transformers_jax.modules import layer_types


def matmul_params_per_token(cfg) -> int:
  """N of the 6N rule: active weights used in a matmul per token (lookups excluded)."""
  c = as_model_config(cfg)
  parts = analytic_breakdown(c, active=True)
  n = parts.get("attention", 0) + parts.get("feed_forward", 0) + parts.get("patch_embedding", 0)
  n += parts.get("lora", 0)
  n += parts.get("head", 0)
  if c.head_kind in ("lm", "mlm") and c.tie_embeddings:
    n += c.vocab_size * c.d_model  # the tied unembedding is still a matmul
  # multi-token prediction: its modules, and the shared head once more per depth
  n += parts.get("mtp", 0) + c.mtp_depth * c.vocab_size * c.d_model
  return n


def attended_keys(c, layers: int, seq_len: int) -> int:
  """Keys a query's scores are computed against, summed over `layers` causal blocks of a
  sequence of seq_len: the whole sequence in a full layer, at most model.sliding_window in a
  sliding one and model.attention_chunk in a chunked one (modules/layer_types.py), as the
  kernels compute them (each counts its whole band of keys, as a full layer counts all T)."""
  period, total = layer_types.pattern(c), 0
  for i in range(layers):
    kind = period[i % len(period)].attention
    limit = {"sliding": c.sliding_window, "chunked": c.attention_chunk}.get(kind) or seq_len
    total += min(seq_len, limit)
  return total


def flops_per_token(cfg, seq_len: int | None = None) -> int:
  """Training FLOPs per token (forward + backward): 6N + 12 * sum(H K S) over attention layers,
  S the keys each query attends (attended_keys: a window or chunk where a causal layer has
  one, else the sequence)."""
  c = as_model_config(cfg)
  T = seq_len or c.seq_len_max
  HK = c.num_heads * c.head_width
  # q.k and weights.v of self-attention: 2 H K each, or 2 H (N + R) and 2 H V with MLA
  self_hk = c.num_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim) / 2
  self_hk = self_hk if c.mla else HK
  if c.family == "encoder_decoder":
    decoder = c.stack_config("decoder")
    HK_dec = decoder.num_heads * decoder.head_width
    self_dec = self_hk if c.mla else HK_dec
    # the decoder's self-attention over its attended keys, its cross-attention over the T source
    # tokens, and the encoder's bidirectional self-attention over all T
    attn = self_dec * attended_keys(decoder, c.decoder_layers, T) + T * (
        self_hk * c.encoder_layers + HK_dec * c.decoder_layers
    )
  elif c.family == "decoder":  # the multi-token prediction modules attend the whole sequence
    attn = self_hk * (attended_keys(c, c.num_layers, T) + T * c.mtp_depth)
  else:  # bidirectional stacks: windows and chunks apply to causal ones only
    attn = self_hk * T * c.num_layers
  return 6 * matmul_params_per_token(c) + int(12 * attn)


def summary(config) -> dict:
  """Everything `python -m transformers_jax.param_count` prints, for a full experiment config."""
  c = as_model_config(config.model)
  shapes = param_shapes(c)
  parts = tree_breakdown(shapes, c)
  total = sum(v for k, v in parts.items() if k != "blocks")
  published = config.get("published", {})
  # the tokens a sequence holds: a ViT's patches (and class token), whatever the config's text
  # seq_len says (tasks.classify's tokens_per_example, which training's MFU counts)
  seq = c.seq_len_max if c.family == "vit" else (config.get("seq_len", 0) or c.seq_len_max)
  ffn_share = parts.get("feed_forward", 0) / parts["blocks"] if parts.get("blocks") else 0.0
  extra = {}
  if parts.get("mtp"):  # the model as inference runs it, without the multi-token prediction
    extra["without_mtp"] = total - parts["mtp"]
  if state_count(c):  # in the parameter tree, counted nowhere: the routers' bias
    extra["router_bias_state"] = state_count(c)
  return {
      **extra,
      "total": total,
      "analytic": analytic_count(c),
      "published": int(published.get("params", 0)) or None,
      "published_source": published.get("source", "") or None,
      # every component the parameters fall into (blocks overlap them): sums to the total
      "breakdown": {k: n for k, n in ordered(parts).items() if n and k != "blocks"},
      # trained by the optimizer: every parameter, or with LoRA the adapters only
      "trainable": lora_count(c) if c.lora_rank else total,
      "blocks": parts.get("blocks", 0),
      "blocks_share": parts.get("blocks", 0) / total,
      "feed_forward_share_of_blocks": ffn_share,
      "active_per_token": analytic_count(c, active=True),
      "flops_per_token": flops_per_token(c, seq),
      "flops_seq_len": seq,
      # the same at the model's own context (model.max_len; a ViT's patches), which a training
      # seq_len below it (GPT-3's presets train at 128 on a CPU, its context is 2,048) hides
      "context_len": c.seq_len_max,
      "flops_per_token_at_context": flops_per_token(c, c.seq_len_max),
      # a decoder with sliding or chunked layers: the same were every layer full (at seq)
      "flops_per_token_full_attention": full_attention_flops(c, seq),
  }


def full_attention_flops(c, seq_len: int) -> int | None:
  """A decoder's training FLOPs per token at seq_len were every layer to attend the whole
  sequence; None when no layer's window or chunk is shorter than seq_len."""
  if c.family != "decoder":
    return None
  saved = c.num_layers * seq_len - attended_keys(c, c.num_layers, seq_len)
  if not saved:
    return None
  return flops_per_token(c, seq_len) + 12 * c.num_heads * c.head_width * saved


def flops_text(s: dict) -> str:
  """summary()'s FLOPs per token in words, with the sequence length they are for: the config's
  seq_len and, where that differs, the model's own context too."""
  formula = "6N + 12*L*H*K*T, PaLM appendix B"
  full = s.get("flops_per_token_full_attention")
  if full:  # sliding or chunked layers attend their window of the T keys
    formula = (
        "6N + 12*H*K*(keys attended, summed over layers: T, or a layer's window or chunk), "
        f"PaLM appendix B; {full:.4g} at T = {s['flops_seq_len']:,} were every layer full"
    )
  if s["flops_seq_len"] == s["context_len"]:
    return (
        f"{s['flops_per_token']:.4g} ({formula}, T = {s['flops_seq_len']:,}, the model's context)"
    )
  return (
      f"{s['flops_per_token']:.4g} at T = {s['flops_seq_len']:,} (the config's seq_len), "
      f"{s['flops_per_token_at_context']:.4g} at the model's context T = {s['context_len']:,} "
      f"({formula})"
  )
