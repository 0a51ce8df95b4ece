"""How a mixture of experts routes each token, with DeepSeek's options, and its load-balancing
terms: the auxiliary loss, and DeepSeek-V3's auxiliary-loss-free bias.

Scores s [..., E] from the router's logits: softmax over the experts (`model.moe_score=softmax`:
Switch, Mixtral, DeepSeek-V2) or a sigmoid per expert (`sigmoid`: DeepSeek-V3). The top_k
experts are chosen by s + b, b the per-expert bias `e_score_correction_bias` with
`model.moe_score_bias` (else 0), among the experts of the `moe_top_groups` groups (of
`moe_groups` equal groups of consecutive experts) whose two best s + b sum highest. A chosen
expert's weight is its s (never s + b), renormalised over the k chosen with
`model.router_norm_topk`, times `model.moe_routed_scale`. Beside the routed experts an MoE layer
may have `model.num_shared_experts` that every token passes through (one gated feed-forward of
that many times d_ff, modules/feed_forward.py).

The bias is state, not a parameter: it lives in the parameter tree (so checkpoints, both layouts
of the blocks, populations, conversion and decoding carry it as they are), is never
differentiated nor given optimizer state (models/lora.py's `trainable` leaves it out), and the
update body (train/step.py) moves it after every step by `model.moe_bias_speed` (gamma) against
the load each expert had in that step: b_e <- b_e + gamma sign(mean load - load_e), DeepSeek-V3's
rule (section 2.1.2 of its report).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformers_jax.modules.placement_base import FFN_MID_NORM
from transformers_jax.modules.placements import PLACEMENTS

BIAS = "e_score_correction_bias"  # the bias's parameter name (Hugging Face's, too)
LOAD = "expert_fraction"  # what each MoE layer sows into moe_stats: its experts' share of choices
SCORES = ("softmax", "sigmoid")


def router_scores(c, logits):
  """Scores s [..., E] (float32) of the router's logits."""
  logits = logits.astype(jnp.float32)
  return jax.nn.sigmoid(logits) if c.moe_score == "sigmoid" else jax.nn.softmax(logits, axis=-1)


def choose(c, scores, bias=None):
  """(weights [..., k], experts [..., k]) of each token: see the module docstring."""
  pick = scores if bias is None else scores + jax.lax.stop_gradient(bias).astype(scores.dtype)
  E, groups = scores.shape[-1], c.moe_groups
  if groups > 1 and c.moe_top_groups < groups:
    grouped = pick.reshape(*pick.shape[:-1], groups, E // groups)
    best = jax.lax.top_k(grouped, min(2, E // groups))[0].sum(-1)  # [..., groups]
    _, kept = jax.lax.top_k(best, c.moe_top_groups)
    keep = jnp.sum(jax.nn.one_hot(kept, groups, dtype=jnp.int32), axis=-2) > 0
    pick = jnp.where(jnp.repeat(keep, E // groups, axis=-1), pick, -jnp.inf)
  _, experts = jax.lax.top_k(pick, c.top_k)
  weights = jnp.take_along_axis(scores, experts, axis=-1)
  if c.router_norm_topk:
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
  if c.moe_routed_scale != 1.0:
    weights = weights * c.moe_routed_scale
  return weights, experts


def balance_loss(c, scores, choice):
  """The load-balancing loss (times the trainer's moe_aux_weight), 1 when balanced: the Switch
  Transformer's E sum_e f_e P_e over the batch for softmax scores (f_e: fraction of the choices
  sent to e, P_e: mean score); for sigmoid scores DeepSeek-V3's sequence-wise one, the same per
  sequence with each token's scores normalised to sum to 1, averaged over the sequences.
  `choice` [B, T, k, E] one-hot."""
  E = scores.shape[-1]
  if c.moe_score != "sigmoid":
    fraction = jnp.mean(jnp.sum(choice, axis=2), axis=(0, 1)) / c.top_k
    return E * jnp.sum(fraction * jnp.mean(scores, axis=(0, 1)))
  normalised = scores / (jnp.sum(scores, axis=-1, keepdims=True) + 1e-20)
  fraction = jnp.mean(jnp.sum(choice, axis=2), axis=1) / c.top_k  # [B, E]
  return E * jnp.mean(jnp.sum(fraction * jnp.mean(normalised, axis=1), axis=-1))


def _names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def layer_loads(stats) -> dict[str, jax.Array]:
  """{module path: its experts' share of the step's routing choices [..., E]} from the sown
  `moe_stats` (a scanned run's with a leading layer axis): what `updated_bias` reads."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(stats)[0]:
    names = _names(path)
    if LOAD in names:
      out["/".join(names[: names.index(LOAD)])] = leaf
  return out


def updated_bias(c, params, loads):
  """`params` with each MoE layer's bias moved by moe_bias_speed against its experts' loads
  (`layer_loads`, summed over micro-batches: only their signs relative to the mean count)."""
  if not (c.feed_forward == "moe" and c.moe_score_bias and c.moe_bias_speed):
    return params

  def one(path, leaf):
    names = _names(path)
    if names[-1] != BIAS:
      return leaf
    load = loads["/".join(names[:-1])].astype(jnp.float32)
    step = jnp.sign(jnp.mean(load, axis=-1, keepdims=True) - load)
    return (leaf + c.moe_bias_speed * step.reshape(leaf.shape)).astype(leaf.dtype)

  return jax.tree_util.tree_map_with_path(one, params)


def state_count(c) -> int:
  """Values of the routers' bias: state in the parameter tree that counts leave out."""
  if not (c.feed_forward == "moe" and c.moe_score_bias):
    return 0
  stacks = {"encoder_decoder": [c.encoder_layers, c.decoder_layers]}.get(c.family, [c.num_layers])
  blocks = sum(c.is_moe_layer(i) for n in stacks for i in range(n))
  blocks += sum(c.is_moe_layer(c.num_layers + k) for k in range(c.mtp_depth))
  return blocks * c.num_experts


DEEPSEEK_DEFAULTS = dict(
    num_shared_experts=0,
    moe_first_dense=0,
    moe_dense_d_ff=None,
    moe_score="softmax",
    moe_score_bias=False,
    moe_groups=1,
    moe_top_groups=1,
    moe_routed_scale=1.0,
    moe_scale_input=False,  # (Llama 4's)
)


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of a routing setting that cannot work, or None."""
  if c.feed_forward != "moe":
    for field, default in DEEPSEEK_DEFAULTS.items():
      if getattr(c, field) != default:
        fix = f"only a mixture of experts reads it (model.feed_forward=moe): leave it {default!r}"
        return field, repr(getattr(c, field)), fix
    return None
  for field in ("num_shared_experts", "moe_first_dense"):
    if getattr(c, field) < 0:
      return field, str(getattr(c, field)), "must be >= 0 (0: none)"
  if c.moe_dense_d_ff is not None and c.moe_dense_d_ff < 1:
    return "moe_dense_d_ff", str(c.moe_dense_d_ff), "must be positive or None (= d_ff)"
  depth = max(c.encoder_layers, c.decoder_layers) if c.family == "encoder_decoder" else c.num_layers
  if c.moe_first_dense >= depth:
    fix = f"below the {depth} blocks of the deepest stack, or no block would be MoE"
    return "moe_first_dense", str(c.moe_first_dense), fix
  if c.moe_groups < 1 or c.num_experts % c.moe_groups:
    return "moe_groups", str(c.moe_groups), f"must divide num_experts={c.num_experts}"
  if not 1 <= c.moe_top_groups <= c.moe_groups:
    return "moe_top_groups", str(c.moe_top_groups), f"must be in [1, moe_groups={c.moe_groups}]"
  reachable = c.num_experts // c.moe_groups * c.moe_top_groups
  if c.top_k > reachable:
    fix = f"at most the {reachable} experts of moe_top_groups={c.moe_top_groups} groups"
    return "top_k", str(c.top_k), fix
  if not c.moe_routed_scale > 0:
    return "moe_routed_scale", str(c.moe_routed_scale), "must be positive (DeepSeek-V3: 2.5)"
  if c.moe_bias_speed < 0:
    return "moe_bias_speed", str(c.moe_bias_speed), "must be >= 0 (DeepSeek-V3: 0.001; 0: frozen)"
  if c.num_shared_experts and FFN_MID_NORM in PLACEMENTS[c.norm_placement].features:
    fix = "a norm inside the feed-forward has no place beside shared experts: use pre"
    return "norm_placement", repr(c.norm_placement), fix
  return None
