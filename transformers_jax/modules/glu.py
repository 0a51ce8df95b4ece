"""How a gated feed-forward (dense or an expert) combines its two projections, gate and up.

The GLU variants of ACTIVATIONS pass act(gate) * up on. gpt-oss's experts (model.activation=
swiglu_clamped) clamp both halves first and add one to the up half:

    gate <- min(gate, limit);  up <- clip(up, -limit, limit)
    out = (up + 1) * gate * sigmoid(alpha * gate)

with alpha = model.glu_alpha (1.702, the sigmoid approximation of GELU's slope) and limit =
model.glu_limit (7). `ffn_activation` gives the callable every feed-forward path takes and
`combine` applies it, so the dense FFN, the dense expert reference and the ragged and
streamed expert paths share one definition.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from transformers_jax.modules.common import activation


@dataclasses.dataclass(frozen=True)
class ClampedSwiGLU:
  """gpt-oss's gated non-linearity (see the module docstring)."""

  alpha: float
  limit: float

  def __call__(self, gate):
    """The gate's half alone: min(gate, limit) sigmoid(alpha min(gate, limit))."""
    gate = jnp.minimum(gate, jnp.asarray(self.limit, gate.dtype))
    return gate * jax.nn.sigmoid(jnp.asarray(self.alpha, gate.dtype) * gate)

  def combine(self, gate, up):
    up = jnp.clip(up, jnp.asarray(-self.limit, up.dtype), jnp.asarray(self.limit, up.dtype))
    return (up + jnp.asarray(1, up.dtype)) * self(gate)


def ffn_activation(cfg):
  """The feed-forward's non-linearity for model.activation: a jax.nn function (of the gate when
  gated), or ClampedSwiGLU for swiglu_clamped."""
  if cfg.activation == "swiglu_clamped":
    return ClampedSwiGLU(cfg.glu_alpha, cfg.glu_limit)
  return activation(cfg.activation)


def combine(act, gate, up):
  """A gated FFN's hidden activations: act's own combination where it has one, else
  act(gate) * up."""
  own = getattr(act, "combine", None)
  return own(gate, up) if own is not None else act(gate) * up


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of a clamped-SwiGLU setting that cannot work or that nothing reads."""
  for field, default in (("glu_alpha", 1.702), ("glu_limit", 7.0)):
    value = getattr(c, field)
    if c.activation != "swiglu_clamped" and value != default:
      fix = f"only activation=swiglu_clamped reads it: set activation=swiglu_clamped or {default}"
      return field, str(value), fix
    if not value > 0:
      return field, str(value), f"must be positive (gpt-oss: {default})"
  return None
