"""Multi-head attention with grouped key/value heads (MHA, GQA, MQA), self or cross.

Shapes: x [B, T, D], context [B, S, D]; q [B, T, H, K], k and v [B, S, G, K]; H % G == 0.
`mask` is an `AttentionMask` (modules/masks.py: segment ids, key padding and positions per
token, what the blockwise kernels read) or a dense boolean mask broadcastable to [B, H, T, S]
(True = may attend), or None.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from transformers_jax.modules.attention_core import (  # the core, re-exported from here
    AUTO_FLASH_MIN_LENGTH,
    attend,
    choose_impl,
)
from transformers_jax.modules.common import (
    DenseWeights,
    adapter_dropout,
    constant,
    dtype_of,
    fused_dense,
    apply_projection,
)
from transformers_jax.modules.cache import attend_cache, cross_cached, write_cache
from transformers_jax.modules.context import context_size, split_attention
from transformers_jax.modules.layer_types import nope_only, temperature
from transformers_jax.modules.masks import AttentionMask, as_dense, with_window
from transformers_jax.modules import parametrization
from transformers_jax.modules.norms import Norm, norm_over_heads
from transformers_jax.modules.scores import max_attention_logit
from transformers_jax.modules.placement_base import (
    ATTENTION_OUT_NORM,
    HEAD_GAIN,
    QK_SPHERE,
    QKV_NORM,
)
from transformers_jax.modules.placements.ngpt import sphere_query, unit
from transformers_jax.modules.positions import apply_rope, position_scheme
from transformers_jax.modules.sinks import sink_logits

__all__ = ["AUTO_FLASH_MIN_LENGTH", "Attention", "attend", "choose_impl", "max_attention_logit"]


def qk_norm(c, x, name: str):
  """Queries' or keys' norm x [B, T, N, K] (model.qk_norm_kind): per head over head_dim with one
  gain vector (head), over the whole projection N*K (full), or per head without parameters
  (l2: x / RMS(x))."""
  if c.qk_norm_kind == "full":
    return norm_over_heads(c, x, name)
  if c.qk_norm_kind == "l2":
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), -1, keepdims=True) + c.norm_eps)).astype(
        x.dtype
    )
  return Norm(c, axis="head_dim", name=name)(x)


class Attention(nn.Module):
  """Projections q, k, v, out; RoPE on self-attention; a key/value cache when `decode`.

  Decoding (`decode=True`), self-attention: the cache holds kv heads only ([B, G, L, K]), so
  GQA/MQA shrink it by H/G; L is the length of the `init` call's input (init with [B, L] dummy
  tokens for an L-slot cache). Each call writes its T keys/values at the cache index and
  attends over all L slots (`attend_cache`), slots after each query's own being masked; a
  caller's `mask` is over cache slots ([B, 1, 1, L], e.g. left padding). Cross-attention: the
  first call after `init` projects the context (the encoder output) and caches its keys/values;
  later calls reuse them and never look at `context` again. No attention dropout when decoding.

  `value_residual` (self-attention with model.value_residual): the call also takes the stack's
  first-block values and returns (output, those values); see `_value_residual`.
  """

  cfg: "ModelConfig"  # noqa: F821
  causal: bool = False
  deterministic: bool = True
  decode: bool = False
  # A norm placement's initialisers of query/key/value/out (placement_base.Init), as
  # ((projection, rule), ...), and the features it adds here (placement_base.FEATURES).
  init_rules: tuple = ()
  features: tuple[str, ...] = ()
  value_residual: bool = False

  @nn.compact
  def __call__(
      self,
      x,
      context=None,
      mask=None,
      positions=None,
      bias=None,
      window=None,
      layer=None,
      first_values=None,
      first=True,
  ):
    """`bias`: a position scheme's ScoreBias, `window`: a sliding window (int, or traced under
    a scan over layers), both for self-attention only; `layer`: the block's LayerAttention
    (modules/layer_types.py: its chunks and RoPE frequencies), None for the defaults;
    `first_values` and `first`: see `_value_residual`."""
    c = self.cfg
    H, G, K, D = c.num_heads, c.kv_heads, c.head_width, c.d_model
    is_cross = context is not None
    q_names = (("embed", "heads", "head_dim"), ("heads", "head_dim"))
    kv_names = (("embed", "kv_heads", "head_dim"), ("kv_heads", "head_dim"))
    rules = dict(self.init_rules)
    qkv = dict(use_bias=c.use_bias if c.qkv_bias is None else c.qkv_bias)  # q, k, v's biases
    query = DenseWeights(c, (H, K), *q_names, rule=rules.get("query"), name="query", **qkv)
    key = DenseWeights(c, (G, K), *kv_names, rule=rules.get("key"), name="key", **qkv)
    value = DenseWeights(c, (G, K), *kv_names, rule=rules.get("value"), name="value", **qkv)
    lora_x = adapter_dropout(c, self.deterministic)  # LoRA's input (dropout while training)
    # Projections of one input with one shape run as one matmul (fused_dense).
    self_kv = None
    if not is_cross and G == H:
      q, *self_kv = fused_dense(c, x, [query(D), key(D), value(D)], lora_x(x))
    else:
      (q,) = fused_dense(c, x, [query(D)], lora_x(x))
    q = checkpoint_name(q, "query_proj")  # the names remat policies keep (modules/remat.py)
    q = nn.with_logical_constraint(q, ("act_batch", "act_length", "act_heads", None))
    # nGPT: each head's queries and keys on the unit sphere (RoPE keeps a head's norm, so this
    # equals normalising after it), the queries then scaled by `sphere_query`
    sphere = QK_SPHERE in self.features
    on_sphere = (lambda q: sphere_query(self, c, q)) if sphere else (lambda q: q)
    if sphere:
      q = unit(q)
    # normalise the queries and keys (model.qk_norm_kind says over what; qk_norm_rope_only:
    # on the blocks RoPE rotates, whose norm it keeps, so that before or after it is one)
    normed_on = (lambda y, n: nope_only(layer, y, n)) if c.qk_norm_rope_only else (lambda y, n: n)
    if c.qk_norm:
      q = normed_on(q, qk_norm(c, q, "query_norm"))
    if c.attention_temperature_floor and not is_cross:  # Llama 4's, on its NoPE blocks
      at = positions if positions is not None else jnp.arange(x.shape[1])[None]
      q = nope_only(layer, temperature(c, q, at), q)
    if QKV_NORM in self.features:
      q = norm_over_heads(c, q, "query_proj_norm")
    if not c.scale_scores:  # every path divides q.k by sqrt(K): T5 wants q.k as it is
      q = q * jnp.asarray(K**0.5, q.dtype)
    elif c.score_scale_width:  # q.k / sqrt(width) instead (Gemma 2 27B)
      q = q * jnp.asarray((K / c.score_scale_width) ** 0.5, q.dtype)
    query_multiplier = parametrization.of(c).query_multiplier(c)  # μP's 1/d attention
    if query_multiplier != 1.0:
      q = q * jnp.asarray(query_multiplier, q.dtype)

    def normed(k, v):  # keys and values as attention reads them (and the caches hold them)
      k, v = checkpoint_name(k, "key_proj"), checkpoint_name(v, "value_proj")
      if c.qk_norm:
        k = normed_on(k, qk_norm(c, k, "key_norm"))
      if sphere:
        k = unit(k)
      if QKV_NORM in self.features:
        k, v = norm_over_heads(c, k, "key_proj_norm"), norm_over_heads(c, v, "value_proj_norm")
      return k, v

    def project(source):
      if self_kv is not None:
        return normed(*self_kv)
      width = source.shape[-1]
      return normed(*fused_dense(c, source, [key(width), value(width)], lora_x(source)))

    sinks = sink_logits(self, c)  # [H] or None: gpt-oss's per-head logit (modules/sinks.py)
    # the pattern (modules/masks.py) is the mask's; a dense mask or None: the module's `causal`
    pattern = mask if isinstance(mask, AttentionMask) else AttentionMask(causal=self.causal)
    chunk = getattr(layer, "chunk", None)
    if self.decode:  # the cache paths take dense masks (over cache slots), the pattern apart
      mask = as_dense(mask)
    else:
      mask = with_window(mask, window, chunk)
    if self.decode and is_cross:  # keys/values of the context, projected once
      cross = cross_cached(self, project, context)
      out = attend_cache(on_sphere(q), *cross, mask, softcap=c.attention_softcap, sinks=sinks)
    else:
      k, v = project(context if is_cross else x)
      inv_freq = getattr(layer, "inv_freq", None)
      if not is_cross and inv_freq is not None:  # this block's own RoPE frequencies (or none)
        q, k = (apply_rope(y, positions, inv_freq=inv_freq) for y in (q, k))
      elif not is_cross:  # the position scheme's rotation (RoPE), if it has one
        q, k = position_scheme(c).rotate(c, q, k, positions)
      if self.value_residual:
        v, first_values = self._value_residual(v, first_values, first)
      q = on_sphere(q)
      cache_args = (mask, bias, window, pattern, chunk, positions)
      if self.decode and self.has_variable("cache", "cached_key"):
        out = attend_cache(q, *write_cache(self, k, v, *cache_args), c.attention_softcap, sinks)
      else:
        if self.decode:
          write_cache(self, k, v, *cache_args)  # init: shape the cache
        causal = pattern.causal and not is_cross
        dropout_fn = None
        if c.attention_dropout > 0 and not self.deterministic:
          dropout_fn = nn.Dropout(c.attention_dropout, deterministic=False)
        blocks = (c.attention_block_q, c.attention_block_kv)
        core, logit_max = attend, max_attention_logit
        if context_size() > 1:  # the tokens split over mesh.context: modules/context.py
          core, logit_max = split_attention(
              attend, max_attention_logit, positions, c.context_strategy, blocks
          )
        if self.is_mutable_collection("intermediates"):  # evaluation: logit growth
          chosen = choose_impl(c.attention_impl, q, k, dropout_fn is not None)
          blockwise = blocks if chosen in ("flash", "splash") else None
          self.sow(
              "intermediates",
              "attention_logit_max",
              logit_max(q, k, mask, causal, blockwise, bias=bias, cap=c.attention_softcap),
          )
        out = core(
            q,
            k,
            v,
            mask,
            causal,
            dropout_fn,
            c.attention_impl,
            c.attention_query_blocks,
            *blocks,
            bias=bias,
            softcap=c.attention_softcap,
            sinks=sinks,
        )
    out = checkpoint_name(out, "context")
    if HEAD_GAIN in self.features:  # NormFormer: a learned gain per head, initialised to 1
      gain = self.param(
          "head_gain", constant(1.0, ("heads",)), (H,), dtype_of(c.param_dtype)
      ).astype(out.dtype)
      out = out * gain[:, None]
    if ATTENTION_OUT_NORM in self.features:
      out = norm_over_heads(c, out, "heads_out_norm")
    out_weights = DenseWeights(
        c, (D,), ("heads", "head_dim", "embed"), ("embed",), rule=rules.get("out"), name="out"
    )
    out = checkpoint_name(apply_projection(out, out_weights((H, K)), 2, lora_x(out)), "out_proj")
    return (out, first_values) if self.value_residual else out

  def _value_residual(self, v, first_values, first):
    """Value residual learning (ResFormer, Zhou et al. 2024, arXiv 2410.17897): the values v
    [B, T, G, K] of every block but the stack's first become l1 v + l2 V_1, V_1 the first
    block's values at the same positions, (l1, l2) = `value_residual_gain` [2] (learned, from
    0.5 each; the first block's pair is never read). `first`: whether this is the first block
    (a Python bool, or traced under nn.scan), whose own values become V_1; `first_values` the
    incoming V_1 (None: this block is the first). Returns (the values attention reads, V_1).
    The key/value cache holds the mixed values, so decoding needs V_1 at the new positions
    only, which the first block computes in the same call."""
    gains = self.param(
        "value_residual_gain", constant(0.5, (None,)), (2,), dtype_of(self.cfg.param_dtype)
    ).astype(v.dtype)
    if first_values is None or first is True:
      return v, v
    mixed = gains[0] * v + gains[1] * first_values.astype(v.dtype)
    if first is False:
      return mixed, first_values
    return jnp.where(first, v, mixed), jnp.where(first, v, first_values.astype(v.dtype))
