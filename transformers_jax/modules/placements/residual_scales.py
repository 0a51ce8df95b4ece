"""Placements that scale the skip path or the branch, or set the initialisation, to keep a deep
stack trainable: DeepNet's DeepNorm, Admin, ReZero, LayerScale and T-Fixup. Notation: the
package's docstring (modules/placements/__init__.py)."""

from __future__ import annotations

import math

import jax.numpy as jnp

from transformers_jax.modules.placement_base import (
    Depth,
    Placement,
    fourth_root,
    stack_depths,
    xavier,
)

SUBLAYER_ORDER = ("self_attn", "cross_attn", "ffn")


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

  summary = "N(alpha x + f(x)) with DeepNet's alpha, beta and init (Wang et al. 2022)"
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

  summary = (
      "N(omega x + f(x)), omega a learned gain set by a profiling pass (Admin, Liu et al. 2020)"
  )
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

  summary = "x + alpha f(x), one learned alpha per block initialised to 0, no norms (ReZero)"
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

  summary = "ReZero with one alpha per sublayer instead of one per block"

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

  summary = "x + diag(lambda) f(N(x)), lambda a learned gain initialised to epsilon (CaiT)"
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

  summary = "x + f(x) with no norm and T-Fixup's initialisation (Huang et al. 2020)"
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
