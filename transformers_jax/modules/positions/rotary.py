"""RoPE (Su et al.): queries and keys of self-attention rotated by their positions, with Llama
3.1's frequency scaling."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from transformers_jax.modules.positions.base import PositionScheme
from transformers_jax.modules.yarn import FORMAT as YARN_FORMAT
from transformers_jax.modules.yarn import parse_yarn, yarn_frequencies


def parse_rope_scaling(text: str) -> tuple[float, float, float, int] | None:
  """model.rope_scaling "llama3:FACTOR,LOW,HIGH,ORIGINAL_LENGTH" -> the four numbers (None for
  "", for "linear:FACTOR" and for a valid "yarn:..." setting, modules/yarn.py); ValueError for
  anything else."""
  if not text or linear_rope_factor(text) or parse_yarn(text):
    return None
  kind, _, numbers = text.partition(":")
  parts = numbers.split(",")
  if kind != "llama3" or len(parts) != 4:
    raise ValueError(text)
  factor, low, high, original = (float(p) for p in parts)
  if not (factor >= 1 and 0 < low <= high and original >= 1 and original == int(original)):
    raise ValueError(text)
  return factor, low, high, int(original)


def linear_rope_factor(text: str) -> float:
  """model.rope_scaling "linear:FACTOR" (positions divided by FACTOR >= 1: Gemma 3's global
  layers, 8) -> FACTOR; 0.0 for any other setting."""
  kind, _, number = text.partition(":")
  if kind != "linear":
    return 0.0
  try:
    factor = float(number)
  except ValueError:
    return 0.0
  return factor if factor >= 1 and np.isfinite(factor) else 0.0


def rope_frequencies(head_dim: int, theta: float, scaling: str = "") -> np.ndarray:
  """theta^(-2i/head_dim), i < head_dim/2, with Llama 3.1's scaling ("llama3:8,1,4,8192"):
  wavelengths shorter than ORIGINAL/HIGH are kept, those longer than ORIGINAL/LOW are divided
  by FACTOR (slowed down), and those between are blended linearly in ORIGINAL / wavelength;
  or with linear scaling ("linear:8"), every frequency divided by FACTOR; or YaRN's ramp
  between kept and stretched frequencies (modules/yarn.py)."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  if parse_yarn(scaling):
    return yarn_frequencies(head_dim, theta, parse_yarn(scaling)).astype(np.float32)
  if linear_rope_factor(scaling):
    return (inv_freq / linear_rope_factor(scaling)).astype(np.float32)
  parsed = parse_rope_scaling(scaling)
  if parsed is not None:
    factor, low, high, original = parsed
    wavelength = 2 * np.pi / inv_freq
    if high > low:
      blend = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)
    else:  # LOW = HIGH (Llama 4 Scout: 1, 1): no band between kept and slowed ones
      blend = (original / wavelength > low).astype(np.float64)
    scaled = (1 - blend) * inv_freq / factor + blend * inv_freq
    inv_freq = np.where(wavelength < original / high, inv_freq, scaled)
  return inv_freq.astype(np.float32)


def rope_angles(positions, head_dim: int, theta: float, scaling: str = "", inv_freq=None):
  """Angles [..., head_dim/2]: position * frequency i (rope_frequencies, or `inv_freq`)."""
  if inv_freq is None:
    inv_freq = rope_frequencies(head_dim, theta, scaling)
  return positions.astype(jnp.float32)[..., None] * inv_freq


def apply_rope(x, positions, theta: float = 10000.0, scaling: str = "", inv_freq=None):
  """Rotate feature pairs (i, i + K/2) of x [B, T, N, K] by angle(position, i); `inv_freq`
  [K/2] (a layer's own frequencies, maybe traced) replaces those of theta and scaling.

  The half-split pairing (as in GPT-NeoX and LLaMA) rather than adjacent pairs: the two are the
  same rotation up to a fixed permutation of features, so q.k depends only on the offset either way.
  """
  angles = rope_angles(positions, x.shape[-1], theta, scaling, inv_freq)[:, :, None, :]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  xf = x.astype(jnp.float32)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  if parse_yarn(scaling):  # YaRN's attention factor, on queries and keys alike
    out = out * parse_yarn(scaling).scale
  return out.astype(x.dtype)


class Rotary(PositionScheme):
  """RoPE (Su et al.): queries and keys rotated by their positions, base wavelength rope_theta."""

  summary = "RoPE: queries and keys rotated by their positions (model.rope_theta, rope_scaling)"

  def rotate(self, c, q, k, positions):
    return tuple(apply_rope(x, positions, c.rope_theta, c.rope_scaling) for x in (q, k))

  def config_problem(self, c):
    field, width = ("qk_rope_head_dim", c.qk_rope_head_dim) if c.mla else ("head_dim", c.head_width)
    if width % 2:
      return field, str(width), f"RoPE rotates pairs of features: use an even {field}"
    if not c.rope_theta > 0:
      return "rope_theta", str(c.rope_theta), "RoPE's base wavelength must be positive, e.g. 1e4"
    try:
      parse_rope_scaling(c.rope_scaling)
    except ValueError:
      fix = (
          "write llama3:FACTOR,LOW,HIGH,ORIGINAL_LENGTH (Llama 3.1: llama3:8,1,4,8192), "
          f"linear:FACTOR (Gemma 3: linear:8), {YARN_FORMAT} (gpt-oss: yarn:32,32,1,4096,0) "
          "or ''"
      )
      return "rope_scaling", repr(c.rope_scaling), fix
    return super().config_problem(c)
