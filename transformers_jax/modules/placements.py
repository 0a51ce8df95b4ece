"""Every norm placement, one entry each: `model.norm_placement=NAME` picks it in all families.

Notation: x is the residual stream entering a sublayer, f the sublayer (attention or
feed-forward), N a norm of the config's kind (`model.norm`), l the block's 0-based index in its
stack of L blocks. For an encoder-decoder, N_enc and M_dec are the two stacks' depths.

Adding a placement: write a `Placement` subclass here (its `sublayer` or `block`, plus any of
`projection_init`, `token_embedding_std`, `profile`, `features`, `final_norm`, `arg_*`) and
add it to PLACEMENTS. Everything else (config validation, the four families, scan and remat,
decoding, counting, the tests that run every placement) reads this table.
"""

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
    fourth_root,
    stack_depths,
    xavier,
)

SUBLAYER_ORDER = ("self_attn", "cross_attn", "ffn")


class Pre(Placement):
  """x + f(N(x)) — pre-LN (Xiong et al. 2020; GPT-2, ViT)."""

  final_norm = True
  paper_init = "megatron"
  paper_init_source = "GPT-2 (Radford et al. 2019): residual projections scaled by 1/sqrt(N)"

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(fn(site.norm(f"{name}_norm")(x))))


class Post(Placement):
  """N(x + f(x)) — post-LN, the 2017 Transformer and BERT."""

  paper_init = "xavier"
  paper_init_source = "the 2017 Transformer's tensor2tensor and fairseq: Xavier, embeddings d^-1/2"

  def sublayer(self, site, x, name, fn):
    return site.norm(f"{name}_norm")(site.add(x, site.dropout(fn(x))))


class Sandwich(Placement):
  """x + N_out(f(N_in(x))) — CogView's sandwich LN, Gemma 2's pre+post norm; with
  `model.embed_norm=True` it is Peri-LN (Kim et al. 2025)."""

  final_norm = True

  def sublayer(self, site, x, name, fn):
    y = site.norm(f"{name}_norm_out")(fn(site.norm(f"{name}_norm_in")(x)))
    return site.add(x, site.dropout(y))


class Peri(Sandwich):
  """Peri-LN (Kim et al. 2025): the sandwich x + N_out(f(N_in(x))), a norm on the embeddings'
  output and a final norm. Init: Megatron-LM's, the framework the paper trained with."""

  embed_norm = True
  paper_init = "megatron"
  paper_init_source = "Kim et al. 2025 trained with Megatron-LM (its scaled output init)"


class NoNorm(Placement):
  """x + f(x) — no norm at all."""

  uses_norms = False

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(fn(x)))


def deepnet_constants(depth: Depth) -> tuple[float, float]:
  """(alpha, beta) of DeepNet (Wang et al. 2022, Table 1): encoder-only or decoder-only with N
  layers alpha = (2N)^1/4, beta = (8N)^-1/4; encoder-decoder (N encoder, M decoder layers):
  encoder alpha = 0.81 (N^4 M)^1/16, beta = 0.87 (N^4 M)^-1/16; decoder alpha = (3M)^1/4,
  beta = (12M)^-1/4."""
  if depth.role == "single":
    n = depth.num_layers
    return fourth_root(2 * n), 1 / fourth_root(8 * n)
  if depth.role == "encoder":
    n, m = depth.num_layers, depth.other_layers
    return 0.81 * math.pow(n**4 * m, 1 / 16), 0.87 * math.pow(n**4 * m, -1 / 16)
  m = depth.num_layers
  return fourth_root(3 * m), 1 / fourth_root(12 * m)


class DeepNorm(Placement):
  """N(alpha x + f(x)) — DeepNet (Wang et al. 2022), alpha and beta from `deepnet_constants`.
  Init: Xavier normal with gain beta on the feed-forward, value and out projections, gain 1 on
  query and key (the paper's pseudo-code)."""

  paper_init = "xavier"
  paper_init_source = "Wang et al. 2022, Figure 2's pseudo-code (fairseq): Xavier normal"

  def sublayer(self, site, x, name, fn):
    alpha, _ = deepnet_constants(site.depth)
    return site.norm(f"{name}_norm")(site.add(alpha * x, site.dropout(fn(x))))

  def projection_init(self, cfg, depth, sublayer):
    _, beta = deepnet_constants(depth)
    return {**xavier(beta), **xavier(1.0, names=("query", "key"))}


class Admin(Placement):
  """N(omega * x + f(x)), omega a learned [D] gain per sublayer — Admin (Liu et al. 2020).
  omega is set by one profiling pass at initialisation: for the i-th sublayer of a stack,
  omega_i = sqrt(sum over j < i of Var[f_j]), where f_0 is the stack's input (the embeddings)
  and f_j the j-th sublayer's branch output (sublayers in order: blocks, and within a block
  self-attention, cross-attention, feed-forward)."""

  profiled = True
  paper_init = "xavier"
  paper_init_source = "Liu et al. 2020 trained in fairseq: Xavier uniform, embeddings d^-1/2"

  def sublayer(self, site, x, name, fn):
    omega = site.gain(f"{name}_skip_gain", (site.cfg.d_model,), 1.0)
    y = fn(x)
    if site.block.is_mutable_collection("profile"):
      site.block.sow("profile", f"{name}_branch_var", jnp.var(y.astype(jnp.float32)))
    return site.norm(f"{name}_norm")(site.add(omega.astype(x.dtype) * x, site.dropout(y)))

  def profile(self, params, profiled, cfg):
    params = dict(params)
    for stack, (layers, _, _) in stack_depths(cfg).items():
      sown, tree = profiled[stack], dict(params[stack])
      scanned = "layers" in tree
      blocks = [sown["layers"]] if scanned else [sown[f"layer_{i}"] for i in range(layers)]
      subs = [s for s in SUBLAYER_ORDER if f"{s}_branch_var" in blocks[0]]
      # Var[f_j] per (block, sublayer), in the order the residual stream meets them
      var = jnp.stack(
          [jnp.stack([jnp.ravel(b[f"{s}_branch_var"][0]) for s in subs], -1) for b in blocks]
      ).reshape(layers, len(subs))
      before = sown["input_var"][0] + jnp.cumsum(var.ravel()) - var.ravel()  # sum over j < i
      omega = jnp.sqrt(before).reshape(layers, len(subs))
      for j, sub in enumerate(subs):
        name = f"{sub}_skip_gain"
        if scanned:  # [L, D]: block i's row is omega[i]
          block = tree["layers"]
          tree["layers"] = {**block, name: replace_value(block[name], omega[:, j, None])}
          continue
        for i in range(layers):
          block = tree[f"layer_{i}"]
          tree[f"layer_{i}"] = {**block, name: replace_value(block[name], omega[i, j])}
      params[stack] = tree
    return params


def replace_value(leaf, value):
  """`leaf` (an array or a boxed, logically partitioned one) with every element of its value
  set to `value` (broadcast)."""
  if hasattr(leaf, "replace_boxed"):
    return leaf.replace_boxed(jnp.broadcast_to(value, leaf.value.shape).astype(leaf.value.dtype))
  return jnp.broadcast_to(value, leaf.shape).astype(leaf.dtype)


class ReZero(Placement):
  """x + alpha f(x) for every sublayer of a block, alpha one learned scalar per block (shared
  by its sublayers) initialised to 0, no norms — ReZero (Bachlechner et al. 2020): x_{i+1} =
  x_i + alpha_i F(x_i) with F the whole layer, as the authors' transformer layer has one
  `resweight` for its attention and its feed-forward."""

  uses_norms = False
  paper_init = "xavier"
  paper_init_source = "Bachlechner et al. 2020's transformer: PyTorch's Xavier uniform"

  def block(self, site, x, sublayers):
    alpha = site.gain("branch_gain", (), 0.0)
    for _, fn in sublayers:
      x = site.add(x, alpha.astype(x.dtype) * site.dropout(fn(x)))
    return x


class ReZeroSublayer(ReZero):
  """ReZero with one alpha per sublayer (each initialised to 0) instead of one per block."""

  def block(self, site, x, sublayers):
    for name, fn in sublayers:
      alpha = site.gain(f"{name}_branch_gain", (), 0.0)
      x = site.add(x, alpha.astype(x.dtype) * site.dropout(fn(x)))
    return x


def cait_epsilon(layers: int) -> float:
  """CaiT's LayerScale initial value by depth (Touvron et al. 2021, section 3): 0.1 up to 18
  blocks, 1e-5 up to 24, 1e-6 beyond."""
  return 0.1 if layers <= 18 else (1e-5 if layers <= 24 else 1e-6)


class LayerScale(Placement):
  """x + diag(lambda) f(N(x)), lambda a learned [D] gain per sublayer initialised to epsilon —
  LayerScale (CaiT, Touvron et al. 2021); epsilon by the stack's depth (`cait_epsilon`)."""

  final_norm = True
  arg_meaning = "lambda's initial value (default: CaiT's rule by depth)"
  paper_init_source = "CaiT (DeiT's recipe): truncated normal, std 0.02"

  def sublayer(self, site, x, name, fn):
    eps = self.arg(site.cfg) or cait_epsilon(site.depth.num_layers)
    lam = site.gain(f"{name}_branch_gain", (site.cfg.d_model,), eps)
    return site.add(x, lam.astype(x.dtype) * site.dropout(fn(site.norm(f"{name}_norm")(x))))


def tfixup_scale(cfg, depth: Depth) -> float:
  """T-Fixup's factor (Huang et al. 2020): 0.67 N^-1/4 in an encoder of N layers, (9M)^-1/4 in
  a decoder of M layers (a decoder-only stack counts as a decoder)."""
  if depth.role == "encoder" or (depth.role == "single" and cfg.family != "decoder"):
    return 0.67 / fourth_root(depth.num_layers)
  return 1 / fourth_root(9 * depth.num_layers)


class TFixup(Placement):
  """x + f(x) with no norm and T-Fixup's initialisation (Huang et al. 2020): Xavier uniform for
  every projection; the value, out and feed-forward projections scaled by `tfixup_scale`; token
  embeddings N(0, d^-1/2) times the decoder's factor (the encoder's in an encoder-only model)."""

  uses_norms = False
  paper_init = "xavier"
  paper_init_source = "Huang et al. 2020: Xavier uniform under its scales (its own rules)"

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(fn(x)))

  def projection_init(self, cfg, depth, sublayer):
    scale = tfixup_scale(cfg, depth)
    return {**xavier(scale, "uniform"), **xavier(1.0, "uniform", ("query", "key"))}

  def token_embedding_std(self, cfg):
    depths = stack_depths(cfg)
    name = "decoder" if "decoder" in depths else "encoder"
    layers, other, role = depths[name]
    return cfg.d_model**-0.5 * tfixup_scale(cfg, Depth(0, layers, role, other))


class Reordered(Placement):
  """x + N(f(x)) — OLMo 2's reordered norm (with model.qk_norm), Swin Transformer v2's
  res-post-norm."""

  final_norm = True
  paper_init_source = "OLMo 2 (2024): every weight N(0, 0.02)"

  def sublayer(self, site, x, name, fn):
    return site.add(x, site.dropout(site.norm(f"{name}_norm")(fn(x))))


class NormFormer(Placement):
  """Pre-LN plus three operations (Shleifer et al. 2021): attention x + N_out(f(N(x))) with a
  learned gain per head (initialised to 1) before the out projection; feed-forward
  x + W_o N_mid(act(W_i N(x)))."""

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

  final_norm = True
  paper_init_source = "Sun et al. 2025 (LLaMA-style models): N(0, 0.02), no scaled init"

  def sublayer(self, site, x, name, fn):
    scale = 1 / jnp.sqrt(jnp.asarray(site.depth.layer, jnp.float32) + 1)
    h = site.norm(f"{name}_norm")(x)
    return site.add(x, site.dropout(fn(h * scale.astype(h.dtype))))


class Parallel(Placement):
  """x + sum_i f_i(N(x)): every sublayer of the block reads one norm of the block's input and
  their outputs are added together (GPT-J, PaLM, ViT-22B)."""

  final_norm = True

  def block(self, site, x, sublayers):
    h = site.norm("input_norm")(x)
    total = sum(site.dropout(fn(h)) for _, fn in sublayers)
    return site.add(x, total)


class MixLN(Placement):
  """Mix-LN (Li et al. 2024): post-LN N(x + f(x)) in the first floor(alpha L) blocks of a
  stack, pre-LN x + f(N(x)) in the rest; alpha = 0.25 by default."""

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


class NGPT(Placement):
  """nGPT (Loshchilov et al. 2024), the normalised Transformer, is not built: it needs every
  weight matrix's rows renormalised to unit norm after each optimizer step and learned
  eigen learning rates on the residual updates; the trainer has no per-step weight hook yet.
  Validation refuses it with that reason."""

  unavailable = (
      "nGPT needs every weight row renormalised to unit length after each optimizer step "
      "(a per-step weight hook the trainer does not have) and eigen learning rates on the "
      "residual updates: not built; the closest built schemes are norm_placement=reordered or "
      "sandwich with model.qk_norm=True"
  )


PLACEMENTS: dict[str, Placement] = {
    "pre": Pre(),
    "post": Post(),
    "sandwich": Sandwich(),
    "peri": Peri(),
    "none": NoNorm(),
    "deepnorm": DeepNorm(),
    "admin": Admin(),
    "rezero": ReZero(),
    "rezero_sublayer": ReZeroSublayer(),
    "layerscale": LayerScale(),
    "tfixup": TFixup(),
    "reordered": Reordered(),
    "normformer": NormFormer(),
    "hybrid": HybridNorm(),
    "subln": SubLN(),
    "b2t": B2T(),
    "scaled": Scaled(),
    "parallel": Parallel(),
    "mixln": MixLN(),
    "ngpt": NGPT(),
}
