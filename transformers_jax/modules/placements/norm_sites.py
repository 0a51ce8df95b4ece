"""Placements that differ in where the norms sit around each sublayer (and what inner norms
the sublayers take): pre, post, sandwich and Peri-LN, no norm, OLMo 2's reordered norm,
NormFormer, HybridNorm, Sub-LN, B2T, LayerNorm Scaling, parallel blocks and Mix-LN. Notation:
the package's docstring (modules/placements/__init__.py)."""

from __future__ import annotations

import math

import jax.numpy as jnp

from transformers_jax.modules.placement_base import (
    ATTENTION_OUT_NORM,
    FFN_MID_NORM,
    HEAD_GAIN,
    QKV_NORM,
    Depth,
    Placement,
    xavier,
)


class Pre(Placement):
  """x + f(N(x)) — pre-LN (Xiong et al. 2020; GPT-2, ViT)."""

  summary = "x + f(N(x)): pre-LN (Xiong et al. 2020; GPT-2, ViT)"
  final_norm = True
  paper_init = "megatron"
  paper_init_source = "GPT-2 (Radford et al. 2019): residual projections scaled by 1/sqrt(N)"

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(fn(site.norm(f"{name}_norm")(x))))


class Post(Placement):
  """N(x + f(x)) — post-LN, the 2017 Transformer and BERT."""

  summary = "N(x + f(x)): post-LN (the 2017 Transformer, BERT)"
  paper_init = "xavier"
  paper_init_source = "the 2017 Transformer's tensor2tensor and fairseq: Xavier, embeddings d^-1/2"

  def sublayer(self, site, x, name, fn):
    return site.norm(f"{name}_norm")(site.add(x, site.dropout(fn(x))))


class Sandwich(Placement):
  """x + N_out(f(N_in(x))) — CogView's sandwich LN, Gemma 2's pre+post norm; with
  `model.embed_norm=True` it is Peri-LN (Kim et al. 2025)."""

  summary = "x + N_out(f(N_in(x))): sandwich LN (CogView; Gemma 2's pre+post norm)"
  final_norm = True

  def sublayer(self, site, x, name, fn):
    y = site.norm(f"{name}_norm_out")(fn(site.norm(f"{name}_norm_in")(x)))
    return site.add(x, site.dropout(y))


class Peri(Sandwich):
  """Peri-LN (Kim et al. 2025): the sandwich x + N_out(f(N_in(x))), a norm on the embeddings'
  output and a final norm. Init: Megatron-LM's, the framework the paper trained with."""

  summary = (
      "Peri-LN (Kim et al. 2025): the sandwich, plus a norm on the embeddings and a final norm"
  )
  embed_norm = True
  paper_init = "megatron"
  paper_init_source = "Kim et al. 2025 trained with Megatron-LM (its scaled output init)"


class NoNorm(Placement):
  """x + f(x) — no norm at all."""

  summary = "x + f(x): no norm at all"
  uses_norms = False

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(fn(x)))


class Reordered(Placement):
  """x + N(f(x)) — OLMo 2's reordered norm (with model.qk_norm), Swin Transformer v2's
  res-post-norm."""

  summary = "x + N(f(x)): OLMo 2's reordered norm, Swin Transformer v2's res-post-norm"
  final_norm = True
  paper_init_source = "OLMo 2 (2024): every weight N(0, 0.02)"

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(site.norm(f"{name}_norm")(fn(x))))


class NormFormer(Placement):
  """Pre-LN plus three operations (Shleifer et al. 2021): attention x + N_out(f(N(x))) with a
  learned gain per head (initialised to 1) before the out projection; feed-forward
  x + W_o N_mid(act(W_i N(x)))."""

  summary = "pre-LN plus a norm after attention, per-head gains and a mid-FFN norm (NormFormer)"
  final_norm = True
  features = (HEAD_GAIN, FFN_MID_NORM)
  paper_init_source = "Shleifer et al. 2021 (fairseq's GPT-3 replication): N(0, 0.02)"

  def sublayer(self, site, x, name, fn):
    y = fn(site.norm(f"{name}_norm")(x))
    if name != "ffn":
      y = site.norm(f"{name}_norm_out")(y)
    return site.add(x, site.dropout(y))


class HybridNorm(Placement):
  """HybridNorm (Zhuo et al. 2025): attention y = x + f_qkv(x), with N on the query, key and
  value projections inside f and no norm outside; feed-forward N(y) + f(N(y)), the norm on the
  residual stream itself (the authors' released OLMo configuration: ffn_residual_after_norm);
  the base model's final norm kept. Init: Megatron's (their configs' init_fn)."""

  summary = "QKV norm inside attention, N(y) + f(N(y)) around the FFN (HybridNorm, 2025)"
  final_norm = True
  features = (QKV_NORM,)
  paper_init = "megatron"
  paper_init_source = "Zhuo et al. 2025's released configs: init_fn full_megatron"

  def sublayer(self, site, x, name, fn):
    if name == "ffn":
      h = site.norm(f"{name}_norm")(x)
      return site.add(h, site.dropout(fn(h)))
    return site.add(x, site.dropout(fn(x)))


def magneto_gain(depth: Depth) -> float:
  """Sub-LN's init gain gamma (Magneto, Wang et al. 2022): sqrt(log 2N) for encoder-only or
  decoder-only; encoder-decoder: encoder sqrt(log 3M * log 2N / 3), decoder sqrt(log 3M)."""
  if depth.role == "single":
    return math.sqrt(math.log(2 * depth.num_layers))
  if depth.role == "encoder":
    n, m = depth.num_layers, depth.other_layers
    return math.sqrt(math.log(3 * m) * math.log(2 * n) / 3)
  return math.sqrt(math.log(3 * depth.num_layers))


class SubLN(Placement):
  """Sub-LN (Magneto, Wang et al. 2022): attention x + W_o N(attn(N(x))), feed-forward
  x + W_o N(act(W_i N(x))); Xavier normal init with gain `magneto_gain` on the feed-forward,
  value and out projections, gain 1 on query and key."""

  summary = "Sub-LN (Magneto): pre-LN plus a norm before each output projection, Magneto's init"
  final_norm = True
  features = (ATTENTION_OUT_NORM, FFN_MID_NORM)
  paper_init = "xavier"
  paper_init_source = "Magneto (Wang et al. 2022): Xavier normal under its gain (its own rules)"

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(fn(site.norm(f"{name}_norm")(x))))

  def projection_init(self, cfg, depth, sublayer):
    return {**xavier(magneto_gain(depth)), **xavier(1.0, names=("query", "key"))}


class B2T(Placement):
  """Post-LN with a bottom-to-top connection (Takase et al. 2023): within a block
  h <- N(h + f(h)) for every sublayer but the last, whose norm also takes the block's input:
  N(h + f(h) + x)."""

  summary = "post-LN with a bottom-to-top connection of the block's input (Takase et al. 2023)"
  paper_init = "xavier"
  paper_init_source = "Takase et al. 2023 trained in fairseq: Xavier uniform"

  def block(self, site, x, sublayers):
    h = x
    for i, (name, fn) in enumerate(sublayers):
      y = site.add(h, site.dropout(fn(h)))
      if i == len(sublayers) - 1 and site.cfg.residual:
        y = y + x
      h = site.norm(f"{name}_norm")(y)
    return h


class Scaled(Placement):
  """x + f(N(x) / sqrt(l + 1)) — LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth"):
  pre-LN with the norm's output scaled by the inverse square root of the block's 1-based
  depth."""

  summary = "x + f(N(x) / sqrt(l + 1)): LayerNorm Scaling (Sun et al. 2025)"
  final_norm = True
  paper_init_source = "Sun et al. 2025 (LLaMA-style models): N(0, 0.02), no scaled init"

  def sublayer(self, site, x, name, fn):
    scale = 1 / jnp.sqrt(jnp.asarray(site.depth.layer, jnp.float32) + 1)
    h = site.norm(f"{name}_norm")(x)
    return site.add(x, site.dropout(fn(h * scale.astype(h.dtype))))


class Parallel(Placement):
  """x + sum_i f_i(N(x)): every sublayer of the block reads one norm of the block's input and
  their outputs are added together (GPT-J, PaLM, ViT-22B)."""

  summary = "x + sum_i f_i(N(x)): parallel sublayers on one norm (GPT-J, PaLM, ViT-22B)"
  final_norm = True

  def block(self, site, x, sublayers):
    h = site.norm("input_norm")(x)
    total = sum(site.dropout(fn(h)) for _, fn in sublayers)
    return site.add(x, total)


class MixLN(Placement):
  """Mix-LN (Li et al. 2024): post-LN N(x + f(x)) in the first floor(alpha L) blocks of a
  stack, pre-LN x + f(N(x)) in the rest; alpha = 0.25 by default."""

  summary = "Mix-LN (Li et al. 2024): post-LN in the first alpha L blocks, pre-LN in the rest"
  final_norm = True
  arg_meaning = "alpha, the fraction of blocks that are post-LN"
  arg_default = 0.25
  paper_init_source = "Li et al. 2024 (LLaMA-style models): N(0, 0.02)"

  def sublayer(self, site, x, name, fn):
    post_blocks = math.floor(self.arg(site.cfg) * site.depth.num_layers)
    norm = site.norm(f"{name}_norm")
    if site.depth.static:  # a looped stack: one wiring, chosen in Python
      if site.depth.layer < post_blocks:
        return norm(site.add(x, site.dropout(fn(x))))
      return site.add(x, site.dropout(fn(norm(x))))
    # under nn.scan both wirings share f: its input and the output norm are selected per block
    is_post = site.depth.layer < post_blocks
    y = site.add(x, site.dropout(fn(jnp.where(is_post, x, norm(x)))))
    return jnp.where(is_post, norm(y), y)
