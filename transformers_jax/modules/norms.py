"""The norms `model.norm` picks: LayerNorm, RMSNorm, ScaleNorm and DyT, statistics in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from transformers_jax.modules.common import constant, dtype_of, ones, zeros
from transformers_jax.modules.placements import PLACEMENTS

# the names of the norms that feed attention (DyT's per-site alpha_0: model.dyt_alpha_attention)
ATTENTION_INPUTS = ("self_attn_norm", "cross_attn_norm", "input_norm")


class Norm(nn.Module):
  """Over the last axis of x (D features):
    layernorm: (x - mean) / sqrt(var + eps) * gamma + beta
    rmsnorm:   x / sqrt(mean(x^2) + eps) * gamma (+ beta with model.norm_bias)
    scalenorm: g * x / sqrt(sum(x^2) + eps), one learned scalar g initialised to sqrt(D)
               (Nguyen & Salazar 2019; `model.norm_scale=False` keeps g at sqrt(D))
    dyt:       gamma * tanh(alpha * x) + beta, alpha a learned scalar initialised to
               model.dyt_alpha (0.5; model.dyt_alpha_attention in the norms before attention),
               DyT (Zhu et al. 2025): no statistics at all
  gamma (`scale`) with `model.norm_scale`, beta (`bias`) with `model.norm_bias` (default: on
  for layernorm and dyt). flax's own RMSNorm has no bias option, which the ablations need.
  """

  cfg: "ModelConfig"  # noqa: F821
  axis: str | None = "embed"  # logical name of the normalised feature axis (parameter sharding)

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    xf = x.astype(jnp.float32)
    features, pdt = x.shape[-1], dtype_of(c.param_dtype)
    if c.norm == "dyt":
      alpha0 = c.dyt_alpha
      if c.dyt_alpha_attention is not None and (self.name or "").startswith(ATTENTION_INPUTS):
        alpha0 = c.dyt_alpha_attention
      alpha = self.param("alpha", constant(alpha0, ()), (), pdt)
      y = jnp.tanh(alpha.astype(jnp.float32) * xf)
    elif c.norm == "scalenorm":
      g = float(np.sqrt(features))
      if c.norm_scale:
        g = self.param("scale", constant(g, ()), (), pdt).astype(jnp.float32)
      y = g * xf * jax.lax.rsqrt(jnp.sum(jnp.square(xf), -1, keepdims=True) + c.norm_eps)
    else:
      if c.norm == "layernorm":
        xf = xf - xf.mean(-1, keepdims=True)
      y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), -1, keepdims=True) + c.norm_eps)
    if c.norm_scale and c.norm != "scalenorm" and c.norm_unit_offset:  # Gemma stores w, uses 1 + w
      y = y * (1.0 + self.param("scale", zeros((self.axis,)), (features,), pdt).astype(y.dtype))
    elif c.norm_scale and c.norm != "scalenorm":
      y = y * self.param("scale", ones((self.axis,)), (features,), pdt)
    if c.has_norm_bias:
      y = y + self.param("bias", zeros((self.axis,)), (features,), pdt)
    return checkpoint_name(y.astype(dtype_of(c.dtype)), "norm")  # modules/remat.py


def norm_over_heads(cfg, x, name: str):
  """A Norm over the last two axes of x [..., heads, head_dim] taken as one (the whole
  projection's width), its parameters replicated."""
  *lead, heads, width = x.shape
  y = Norm(cfg, axis=None, name=name)(x.reshape(*lead, heads * width))
  return y.reshape(x.shape)


# The model fields only a norm reads, with their defaults (config/model.py).
NORM_FIELDS = {
    "norm": "layernorm",
    "norm_eps": 1e-5,
    "norm_scale": True,
    "norm_unit_offset": False,
    "norm_bias": None,
}


def builds_norms(cfg) -> bool:
  """Whether the model has any norm: its placement's, a final one, the embeddings', q/k norms,
  or the MLM head's transform."""
  mlm = cfg.family == "encoder" and cfg.head_kind == "mlm"
  return bool(
      PLACEMENTS[cfg.norm_placement].uses_norms
      or cfg.has_final_norm
      or cfg.has_embed_norm
      or cfg.qk_norm
      or mlm
  )


def unread_norm_fields(cfg) -> list[tuple[str, str, str]]:
  """(field, why, fix) of the norm settings moved from their defaults that the model never
  reads."""
  if not builds_norms(cfg):
    why = (
        f"norm_placement={cfg.norm_placement} has no norms and neither a final, embedding, q/k "
        "nor MLM-head norm is on, so no norm reads it"
    )
    fix = "leave it out, or pick a placement with norms (--config_help lists them)"
    return [(f, why, fix) for f, default in NORM_FIELDS.items() if getattr(cfg, f) != default]
  if cfg.norm == "scalenorm" and cfg.norm_unit_offset:
    why = "scalenorm's gain is one scalar initialised to sqrt(d_model), stored as it is used"
    return [("norm_unit_offset", why, "leave it False, or use norm=rmsnorm (Gemma's)")]
  return []
