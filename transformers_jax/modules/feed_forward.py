"""Position-wise feed-forward: dense (plain or gated) and a top-k mixture of experts."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from transformers_jax.modules.common import (
    DenseWeights,
    adapter_dropout,
    dense,
    dtype_of,
    fused_dense,
    apply_projection,
    kernel_init,
    zeros,
)
from transformers_jax.modules import glu, moe_routing, quantization
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.placement_base import FFN_MID_NORM, FFN_SCALES
from transformers_jax.modules.placements.ngpt import FFN_SCALE, scaled_gain
from transformers_jax.modules.moe_ragged import ragged_moe
from transformers_jax.modules.splash import target_platform


class FeedForward(nn.Module):
  """D -> F -> D. Gated variants (swiglu, geglu) multiply act(x W0) by x W1 before narrowing.
  A norm placement may set the projections' initialisers (`init_rules`, as in Attention) and add a
  norm on the hidden activations before `wo` (`features`: placement_base.FFN_MID_NORM), or
  nGPT's scales (FFN_SCALES): the gate's input x W0 (a non-gated FFN's x W_i) times s_v sqrt(D)
  (`gate_gain`), the gated one's x W1 times s_u (`up_gain`); placements/ngpt.py."""

  cfg: "ModelConfig"  # noqa: F821
  init_rules: tuple = ()
  features: tuple[str, ...] = ()
  deterministic: bool = True  # False while training: dropout on LoRA adapters' input
  width: int | None = None  # F; None = model.d_ff (shared experts, an MoE model's dense blocks)

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    F = self.width or c.ff_width
    act = glu.ffn_activation(c)
    rules = dict(self.init_rules)
    lora_x = adapter_dropout(c, self.deterministic)
    bias = c.has_ffn_bias  # model.ffn_bias, or use_bias

    def scaled(h, name, factor):  # nGPT's s_v sqrt(D) and s_u (FFN_SCALES)
      if FFN_SCALES not in self.features:
        return h
      s = scaled_gain(self, c, name, (c.ff_width,), FFN_SCALE, ("mlp",))
      return h * (s * factor).astype(h.dtype)

    if c.gated:
      gate, up = (
          DenseWeights(c, (F,), ("embed", "mlp"), ("mlp",), rules.get(name), bias, name=name)
          for name in ("wi_0", "wi_1")
      )
      h0, h1 = fused_dense(c, x, [gate(x.shape[-1]), up(x.shape[-1])], lora_x(x))
      gate = scaled(checkpoint_name(h0, "mlpwi_0"), "gate_gain", c.d_model**0.5)
      h = glu.combine(act, gate, scaled(checkpoint_name(h1, "mlpwi_1"), "up_gain", 1.0))
    else:
      wi = DenseWeights(c, (F,), ("embed", "mlp"), ("mlp",), rules.get("wi"), bias, name="wi")
      h = checkpoint_name(apply_projection(x, wi(x.shape[-1]), 1, lora_x(x)), "mlpwi")
      h = act(scaled(h, "gate_gain", c.d_model**0.5))
    h = nn.with_logical_constraint(h, ("act_batch", "act_length", "act_mlp"))
    if FFN_MID_NORM in self.features:
      h = Norm(c, axis="mlp", name="mid_norm")(h)
    wo = DenseWeights(
        c, (c.d_model,), ("mlp", "embed"), ("embed",), rules.get("wo"), bias, name="wo"
    )
    return checkpoint_name(apply_projection(h, wo(h.shape[-1]), 1, lora_x(h)), "mlpwo")


class FeedForwardKind:
  """Base class of a `model.feed_forward` entry."""

  summary = ""  # one line on what it is (--config_help, docs/config.md, docs/architecture.md)

  def params(self, c, layer: int, active: bool = False) -> int:
    """Parameters of block `layer`'s feed-forward sublayer (`active`: those one token uses)."""
    raise NotImplementedError

  def config_problem(self, c) -> tuple[str, str, str] | None:
    """(field, value, fix) of the first setting of this kind's that cannot work, or None."""
    del c
    return None

  def module(self, c, moe: bool, deterministic: bool, **kwargs) -> nn.Module:
    """The sublayer a Block builds (inside its own call; `kwargs`: its name, and the norm
    placement's init_rules and features); `moe`: the block is one of model.moe_every's."""
    raise NotImplementedError


class Dense(FeedForwardKind):
  summary = "D -> F -> D through the activation (two input projections when it is gated)"

  def module(self, c, moe, deterministic, **kwargs):
    del moe  # an MoE model's dense blocks have their own width (dense_ff_width)
    return FeedForward(c, width=c.dense_ff_width, deterministic=deterministic, **kwargs)

  def params(self, c, layer, active=False, width=None):
    # `width`: F; else a dense block's own (an MoE model's dense blocks may differ: dense_ff_width)
    D, F, b = c.d_model, width or c.dense_ff_width, int(c.has_ffn_bias)
    n_in = 2 if c.gated else 1
    return n_in * (D * F + b * F) + F * D + b * D


class Experts(Dense):
  summary = "a router sends each token to top_k of num_experts dense FFNs, every moe_every-th block"

  def params(self, c, layer, active=False):
    if not c.is_moe_layer(layer):
      return super().params(c, layer)  # the whole FFN of a dense block
    expert = super().params(c, layer, width=c.ff_width)
    router = (c.d_model + int(c.router_bias)) * c.num_experts  # its logits' bias: gpt-oss
    # DeepSeek's shared experts: one FFN num_shared_experts times as wide that every token takes
    shared = c.num_shared_experts and super().params(
        c, layer, width=c.num_shared_experts * c.ff_width
    )
    return router + (c.top_k if active else c.num_experts) * expert + shared

  def module(self, c, moe, deterministic, **kwargs):
    return MoE(c, **kwargs) if moe else super().module(c, moe, deterministic, **kwargs)

  def config_problem(self, c):
    if c.num_experts < 1:
      return "num_experts", str(c.num_experts), "must be a positive integer"
    if not 1 <= c.top_k <= c.num_experts:
      return "top_k", str(c.top_k), f"must be in [1, num_experts={c.num_experts}]"
    if c.capacity_factor <= 0:
      return "capacity_factor", str(c.capacity_factor), "must be positive"
    if c.moe_every < 1:
      return "moe_every", str(c.moe_every), "must be a positive integer"
    if c.moe_scale_input and c.has_ffn_bias:
      fix = "an expert's biases would not scale with its input: set ffn_bias=False"
      return "moe_scale_input", "True", fix
    return None


# Every feed-forward kind, one entry each: `model.feed_forward=NAME` picks it.
FEED_FORWARDS: dict[str, FeedForwardKind] = {"dense": Dense(), "moe": Experts()}


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of a feed-forward setting that cannot work, or None."""
  return FEED_FORWARDS[c.feed_forward].config_problem(c) or moe_routing.config_problem(c)


def router_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of a router setting on a model without a router, or None."""
  if c.feed_forward == "moe":
    return None
  for field, default in (("router_bias", False), ("router_norm_topk", True)):
    if getattr(c, field) != default:
      fix = f"only a mixture of experts has a router: set feed_forward=moe or {default}"
      return field, str(getattr(c, field)), fix
  return None


def route(router_probs, top_k: int, capacity: int, normalize: bool = True):
  """Top-k routing with a per-expert capacity (GShard/Switch style), per sequence.

  router_probs [B, T, E] -> (combine [B, T, E, C] weights, dispatch [B, T, E, C] 0/1).
  Slots are filled first by every token's first choice, then second choices, and so on, in
  token order; a choice that finds its expert full is dropped (the residual carries the token).
  The k chosen weights are renormalised to sum to one (`normalize`; else the probabilities).
  """
  top_p, top_i = jax.lax.top_k(router_probs, top_k)  # [B, T, k]
  if normalize:
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
  return route_choices(top_p, top_i, router_probs.shape[-1], capacity)


def route_choices(top_p, top_i, num_experts: int, capacity: int):
  """`route` for choices made already: weights top_p and experts top_i [B, T, k]."""
  B, T, top_k = top_i.shape
  E = num_experts
  choice = jax.nn.one_hot(top_i, E, dtype=jnp.int32)  # [B, T, k, E]
  ranked = choice.transpose(0, 2, 1, 3).reshape(B, top_k * T, E)  # choice-rank major
  slot = (jnp.cumsum(ranked, axis=1) - 1).reshape(B, top_k, T, E).transpose(0, 2, 1, 3)
  kept = choice * (slot < capacity)  # [B, T, k, E]
  slot_onehot = jax.nn.one_hot(jnp.where(kept > 0, slot, capacity), capacity)  # [B,T,k,E,C]
  dispatch = jnp.einsum("btke,btkec->btec", kept.astype(jnp.float32), slot_onehot)
  combine = jnp.einsum("btk,btke,btkec->btec", top_p, kept.astype(jnp.float32), slot_onehot)
  return combine, dispatch, choice


class MoE(nn.Module):
  """Mixture of experts replacing the FFN: a router picks top_k of num_experts per token.

  `moe_impl` says how tokens reach their experts: `dense`, one-hot [B, T, E, C] dispatch and
  combine einsums with a per-sequence capacity (the reference); `ragged`, tokens sorted by
  expert and grouped matmuls, dropless unless `moe_dropless=False` (modules/moe_ragged.py).
  Both hold the same parameters. Sows, for the trainer:
    losses/moe_aux_loss — the Switch Transformer load-balancing loss E * sum_e f_e * P_e (f_e:
      fraction of routing choices sent to e; P_e: mean router probability), 1 when uniform;
    moe_stats/router_z_loss — ST-MoE's router z-loss, the mean squared log-sum-exp of the
      router logits (weighted by the trainer's moe_router_z_weight);
    moe_stats/expert_fraction — f_e, [E]; moe_stats/dropped_fraction — choices not computed;
  and intermediates/moe_dropped_fraction for evaluation.
  """

  cfg: "ModelConfig"  # noqa: F821
  init_rules: tuple = ()  # as FeedForward's: each expert's matrices get the rule of wi / wi_1 / wo
  features: tuple[str, ...] = ()  # FFN_MID_NORM: one norm (shared by the experts) before wo

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    B, T, D = x.shape
    E, F = c.num_experts, c.ff_width
    router = dense(c, E, -1, ("embed", "experts"), ("experts",), "router", use_bias=c.router_bias)
    logits = router(x)
    logits = logits.astype(jnp.float32)
    probs = moe_routing.router_scores(c, logits)  # softmax, or DeepSeek-V3's sigmoid
    score_bias = None  # DeepSeek-V3's auxiliary-loss-free bias: state, float32 (moe_routing.py)
    if c.moe_score_bias:
      score_bias = self.param(moe_routing.BIAS, zeros(("experts",)), (E,), jnp.float32)
    top_p, top_i = moe_routing.choose(c, probs, score_bias)
    dt, pdt = dtype_of(c.dtype), dtype_of(c.param_dtype)

    rules = dict(self.init_rules)

    def weight(name, shape, names):  # in the parameter dtype: `ragged` casts before gathering
      init = kernel_init(c, rules.get(name), names, in_axis=-2, out_axis=-1, batch_axis=(0,))
      return self.param(name, init, shape, pdt)

    def bias(name, shape, names):  # [E, 1, width] broadcast over batch and capacity slots
      return self.param(name, zeros(names), shape, pdt).astype(dt)

    weights = {
        "wi": weight("wi", (E, D, F), ("experts", "embed", "mlp")),
        **({"bi": bias("bi", (E, 1, F), ("experts", None, "mlp"))} if c.has_ffn_bias else {}),
    }
    if c.gated:
      weights["wi_1"] = weight("wi_1", (E, D, F), ("experts", "embed", "mlp"))
      if c.has_ffn_bias:
        weights["bi_1"] = bias("bi_1", (E, 1, F), ("experts", None, "mlp"))
    weights["wo"] = weight("wo", (E, F, D), ("experts", "mlp", "embed"))
    if c.has_ffn_bias:
      weights["bo"] = bias("bo", (E, 1, D), ("experts", None, "embed"))

    if c.moe_impl == "ragged":
      choice = jax.nn.one_hot(top_i, E, dtype=jnp.float32)
      flat = {k: (v[:, 0] if k.startswith("b") else v) for k, v in weights.items()}
      out, kept = ragged_moe(
          c, x.astype(dt), top_p, top_i, flat, glu.ffn_activation(c), target_platform(), dt
      )
      kept_fraction = jnp.sum(kept) / (B * T * c.top_k)
    else:
      # an expert meets each token of a sequence at most once, so T slots hold every choice
      # (a larger capacity_factor, 1e9 for "never drop", means T: not an int32 overflow)
      capacity = min(T, max(1, math.ceil(c.capacity_factor * T * c.top_k / E)))
      combine, dispatch, choice = route_choices(top_p, top_i, E, capacity)
      weights = {k: v.astype(dt) for k, v in weights.items()}
      mid_norm = None
      if FFN_MID_NORM in self.features:
        mid_norm = Norm(c, axis="mlp", name="mid_norm")
      # the weights on the way in (Llama 4) or on the way out
      into, out_of = (combine, dispatch) if c.moe_scale_input else (dispatch, combine)
      out = dense_experts(c, x.astype(dt), out_of.astype(dt), into.astype(dt), weights, mid_norm)
      kept_fraction = jnp.sum(dispatch) / (B * T * c.top_k)
    if c.num_shared_experts:  # every token's own experts besides the routed ones (DeepSeek)
      shared = FeedForward(c, self.init_rules, width=c.num_shared_experts * F, name="shared")
      out = out + shared(x)
    fraction = jnp.mean(jnp.sum(choice, axis=2), axis=(0, 1)) / c.top_k  # [E]
    self.sow("losses", "moe_aux_loss", moe_routing.balance_loss(c, probs, choice))
    log_z = jax.nn.logsumexp(logits, axis=-1)
    self.sow("moe_stats", "router_z_loss", jnp.mean(jnp.square(log_z)))
    self.sow("moe_stats", "expert_fraction", fraction)
    self.sow("moe_stats", "dropped_fraction", 1.0 - kept_fraction)
    self.sow("intermediates", "moe_dropped_fraction", 1.0 - kept_fraction)
    return checkpoint_name(out, "moe_combine")  # (the ragged path's output is named here)


def dense_experts(c, x, combine, dispatch, weights, mid_norm=None):
  """The experts on capacity slots: x [B, T, D] dispatched to [B, E, C, D] by `dispatch`, each
  expert's FFN (with `mid_norm` on its hidden activations, when given), combined back to
  [B, T, D] by `combine`: the routing weights in one of the two, 0/1 in the other."""
  act = glu.ffn_activation(c)
  zero = 0.0

  def expert_matmul(spec, x, weight):  # quantized where model.quantization says
    return quantization.einsum(spec, x, weight, c.quantization)

  xe = checkpoint_name(jnp.einsum("btd,btec->becd", x, dispatch), "moe_dispatch")  # [B, E, C, D]
  h = expert_matmul("becd,edf->becf", xe, weights["wi"]) + weights.get("bi", zero)
  if c.gated:
    h1 = expert_matmul("becd,edf->becf", xe, weights["wi_1"]) + weights.get("bi_1", zero)
    h = glu.combine(act, checkpoint_name(h, "mlpwi_0"), checkpoint_name(h1, "mlpwi_1"))
  else:
    h = act(checkpoint_name(h, "mlpwi"))
  if mid_norm is not None:
    h = mid_norm(h)
  out = checkpoint_name(
      expert_matmul("becf,efd->becd", h, weights["wo"]) + weights.get("bo", zero), "mlpwo"
  )
  return checkpoint_name(jnp.einsum("becd,btec->btd", out, combine), "moe_combine")
