"""LayerNorm and RMSNorm, each with optional scale and bias, statistics in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.modules.common import dtype_of, ones, zeros


class Norm(nn.Module):
  """`layernorm`: (x - mean) / sqrt(var + eps); `rmsnorm`: x / sqrt(mean(x^2) + eps).

  flax's own RMSNorm has no bias option, which the norm ablations need, so both live here.
  """

  cfg: "ModelConfig"  # noqa: F821
  axis: str = "embed"  # logical name of the normalised feature axis (its parameters' sharding)

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    xf = x.astype(jnp.float32)
    if c.norm == "layernorm":
      xf = xf - xf.mean(-1, keepdims=True)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), -1, keepdims=True) + c.norm_eps)
    features = x.shape[-1]
    if c.norm_scale:
      y = y * self.param("scale", ones((self.axis,)), (features,), dtype_of(c.param_dtype))
    if c.has_norm_bias:
      y = y + self.param("bias", zeros((self.axis,)), (features,), dtype_of(c.param_dtype))
    return y.astype(dtype_of(c.dtype))
