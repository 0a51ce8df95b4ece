"""The norm kinds `model.norm` picks, one `NormKind` each: its formula and its own parameters.

Every kind computes in float32 over the last axis of x (D features). The `Norm` module
(modules/norms.py) then applies what all kinds share: a learned gain gamma (`scale`, [D]) with
`model.norm_scale`, stored as w and used as 1 + w with `model.norm_unit_offset` (Gemma), unless
the kind has a gain of its own (`vector_scale = False`); and a learned shift beta (`bias`, [D])
with `model.norm_bias`, on by default where the kind says so (`bias_by_default`).

Adding a kind: write a `NormKind` subclass (in this module or one of its own) and add it to
NORM_KINDS in modules/norms.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformers_jax.modules.common import constant, dtype_of

# the names of the norms that feed attention (DyT's per-site alpha_0: model.dyt_alpha_attention)
ATTENTION_INPUTS = ("self_attn_norm", "cross_attn_norm", "input_norm")


class NormKind:
  """Base class of a `model.norm` entry."""

  summary = ""  # one line on what it is (--config_help, docs/config.md, docs/architecture.md)
  bias_by_default = False  # a learned shift beta when model.norm_bias is None (unset)
  vector_scale = True  # the shared gain gamma [D] applies (False: the kind has its own)

  def normalise(self, norm, c, x):
    """x [..., D] float32 -> the normalised float32 values, before gamma and beta; parameters of
    the kind's own are made in `norm` (the Norm module: norm.param)."""
    raise NotImplementedError

  def config_problem(self, c) -> tuple[str, str, str] | None:
    """(field, value, fix) of the first setting of this kind's that cannot work, or None."""
    del c
    return None

  def unread_fields(self, c) -> list[tuple[str, str, str]]:
    """(field, why, fix) of the norm settings moved from their defaults that this kind never
    reads."""
    del c
    return []


def _rms(x, eps: float):
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + eps)


class LayerNorm(NormKind):
  """(x - mean) / sqrt(var + eps) * gamma + beta (Ba et al. 2016)."""

  summary = "(x - mean) / sqrt(var + eps) * gamma + beta (Ba et al. 2016)"
  bias_by_default = True

  def normalise(self, norm, c, x):
    return _rms(x - x.mean(-1, keepdims=True), c.norm_eps)


class RMSNorm(NormKind):
  """x / sqrt(mean(x^2) + eps) * gamma (Zhang & Sennrich 2019); + beta with model.norm_bias
  (flax's own RMSNorm has no bias option, which the ablations need)."""

  summary = "x / sqrt(mean(x^2) + eps) * gamma, no centring (Zhang & Sennrich 2019)"

  def normalise(self, norm, c, x):
    return _rms(x, c.norm_eps)


class ScaleNorm(NormKind):
  """g * x / sqrt(sum(x^2) + eps), one learned scalar g (`scale`) initialised to sqrt(D)
  (Nguyen & Salazar 2019); `model.norm_scale=False` keeps g at sqrt(D)."""

  summary = "g * x / ||x||, one learned scalar g initialised to sqrt(D) (Nguyen & Salazar 2019)"
  vector_scale = False

  def normalise(self, norm, c, x):
    g = float(np.sqrt(x.shape[-1]))
    if c.norm_scale:
      pdt = dtype_of(c.param_dtype)
      g = norm.param("scale", constant(g, ()), (), pdt).astype(jnp.float32)
    return g * x * jax.lax.rsqrt(jnp.sum(jnp.square(x), -1, keepdims=True) + c.norm_eps)

  def unread_fields(self, c):
    if c.norm_unit_offset:
      why = "scalenorm's gain is one scalar initialised to sqrt(d_model), stored as it is used"
      return [("norm_unit_offset", why, "leave it False, or use norm=rmsnorm (Gemma's)")]
    return []


class DyT(NormKind):
  """gamma * tanh(alpha * x) + beta, alpha a learned scalar initialised to model.dyt_alpha (0.5;
  model.dyt_alpha_attention in the norms before attention): DyT (Zhu et al. 2025), no
  statistics at all."""

  summary = "gamma * tanh(alpha x) + beta, alpha a learned scalar: no statistics (Zhu et al. 2025)"
  bias_by_default = True

  def normalise(self, norm, c, x):
    alpha0 = c.dyt_alpha
    if c.dyt_alpha_attention is not None and (norm.name or "").startswith(ATTENTION_INPUTS):
      alpha0 = c.dyt_alpha_attention
    alpha = norm.param("alpha", constant(alpha0, ()), (), dtype_of(c.param_dtype))
    return jnp.tanh(alpha.astype(jnp.float32) * x)

  def config_problem(self, c):
    if c.dyt_alpha <= 0 or (c.dyt_alpha_attention is not None and c.dyt_alpha_attention <= 0):
      return "dyt_alpha", str(c.dyt_alpha), "DyT's alpha_0 values must be positive"
    return None
