"""The norm every placement, final norm and embedding norm uses (`model.norm`): the `Norm`
module and the registry of norm kinds whose formulas it applies (modules/norm_kinds.py)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from transformers_jax.modules.common import dtype_of, ones, zeros
from transformers_jax.modules.norm_kinds import DyT, LayerNorm, NormKind, RMSNorm, ScaleNorm
from transformers_jax.modules.placements import PLACEMENTS

# Every norm kind, one entry each: `model.norm=NAME` picks it wherever a norm sits.
NORM_KINDS: dict[str, NormKind] = {
    "layernorm": LayerNorm(),
    "rmsnorm": RMSNorm(),
    "scalenorm": ScaleNorm(),
    "dyt": DyT(),
}


class Norm(nn.Module):
  """Over the last axis of x (D features), statistics in float32: the kind's formula
  (NORM_KINDS[model.norm].normalise, with any parameters of its own), times gamma (`scale`)
  with `model.norm_scale` where the kind takes the shared gain, plus beta (`bias`) with
  `model.norm_bias` (unset: the kind's default)."""

  cfg: "ModelConfig"  # noqa: F821
  axis: str | None = "embed"  # logical name of the normalised feature axis (parameter sharding)

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    kind = NORM_KINDS[c.norm]
    features, pdt = x.shape[-1], dtype_of(c.param_dtype)
    y = kind.normalise(self, c, x.astype(jnp.float32))
    if c.norm_scale and kind.vector_scale and c.norm_unit_offset:  # Gemma stores w, uses 1 + w
      y = y * (1.0 + self.param("scale", zeros((self.axis,)), (features,), pdt).astype(y.dtype))
    elif c.norm_scale and kind.vector_scale:
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
  return NORM_KINDS[cfg.norm].unread_fields(cfg)
