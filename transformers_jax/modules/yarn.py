"""YaRN RoPE scaling (Peng et al. 2023, arXiv 2309.00071), as model.rope_scaling
"yarn:FACTOR,BETA_FAST,BETA_SLOW,ORIGINAL_LENGTH[,TRUNCATE[,ATTENTION_FACTOR[,MSCALE_ALL_DIM]]]".

The rotary frequencies theta^(-2i/K) of a model trained on ORIGINAL_LENGTH positions are
stretched for a context FACTOR times longer, by how many turns each one makes over the original
context: dimensions that turn more than BETA_FAST times keep their frequency (extrapolation),
those that turn fewer than BETA_SLOW times are divided by FACTOR (interpolation), and between
the two bounds (dimensions d_fast .. d_slow, d(r) = K ln(ORIGINAL / (2 pi r)) / (2 ln theta);
rounded outwards when TRUNCATE is 1, the default, kept exact when 0) the two are blended along
a linear ramp. Queries and keys are then both multiplied by ATTENTION_FACTOR (the paper's
0.1 ln FACTOR + 1 when not given), so the scores by its square. Multi-head latent attention
(DeepSeek-V2/V3, modules/mla.py) also multiplies every score by m(FACTOR, MSCALE_ALL_DIM)^2,
m(s, a) = 0.1 a ln(s) + 1 (1 for s <= 1), when MSCALE_ALL_DIM is given and not 0.

gpt-oss: yarn:32,32,1,4096,0 (theta 150,000). DeepSeek-V3's rope_scaling (factor 40, betas 32
and 1, original 4,096, mscale = mscale_all_dim = 1) is yarn:40,32,1,4096,1,1,1: transformers'
attention factor is then m(40, 1) / m(40, 1) = 1, and MLA's scores are multiplied by
m(40, 1)^2 = 1.369^2, about 1.87.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Yarn(NamedTuple):
  factor: float
  beta_fast: float
  beta_slow: float
  original: int
  truncate: bool = True
  attention_factor: float | None = None
  mscale_all_dim: float = 0.0  # MLA's score correction (0: none)

  @property
  def scale(self) -> float:
    """What queries and keys are multiplied by: the given factor, else the paper's."""
    if self.attention_factor is not None:
      return self.attention_factor
    return mscale(self.factor)

  @property
  def softmax_scale(self) -> float:
    """What multi-head latent attention multiplies its scores by besides 1/sqrt(head width)."""
    return mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0

  def text(self) -> str:
    """The model.rope_scaling string of these settings."""
    numbers = [self.factor, self.beta_fast, self.beta_slow, self.original, int(self.truncate)]
    if self.attention_factor is not None or self.mscale_all_dim:
      numbers.append(self.scale)
    if self.mscale_all_dim:
      numbers.append(self.mscale_all_dim)
    return "yarn:" + ",".join(format(float(x), ".17g") for x in numbers)


FORMAT = (
    "yarn:FACTOR,BETA_FAST,BETA_SLOW,ORIGINAL_LENGTH[,TRUNCATE[,ATTENTION_FACTOR[,MSCALE_ALL_DIM]]]"
)


def mscale(factor: float, weight: float = 1.0) -> float:
  """YaRN's attention temperature m(s, a) = 0.1 a ln(s) + 1 (1 for s <= 1)."""
  return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0


def parse_yarn(text: str) -> Yarn | None:
  """model.rope_scaling as YaRN's parameters; None for any other kind of scaling (or none);
  ValueError for a malformed yarn setting."""
  kind, _, numbers = text.partition(":")
  if kind != "yarn":
    return None
  parts = numbers.split(",")
  if not 4 <= len(parts) <= 7:
    raise ValueError(text)
  values = [float(p) for p in parts]
  factor, fast, slow, original = values[:4]
  truncate = values[4] if len(values) > 4 else 1.0
  attention = values[5] if len(values) > 5 else None
  mscale_all_dim = values[6] if len(values) > 6 else 0.0
  if not (
      factor >= 1
      and fast > slow > 0
      and original >= 1
      and original == int(original)
      and truncate in (0.0, 1.0)
      and (attention is None or attention > 0)
      and mscale_all_dim >= 0
      and all(math.isfinite(v) for v in values)
  ):
    raise ValueError(text)
  return Yarn(factor, fast, slow, int(original), bool(truncate), attention, mscale_all_dim)


def yarn_frequencies(head_dim: int, theta: float, yarn: Yarn) -> np.ndarray:
  """The K/2 rotary frequencies [float64] under YaRN (see the module docstring)."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)

  def dimension(turns):  # the dimension whose wavelength fits `turns` times in the original
    return head_dim * math.log(yarn.original / (turns * 2 * math.pi)) / (2 * math.log(theta))

  low, high = dimension(yarn.beta_fast), dimension(yarn.beta_slow)
  if yarn.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, head_dim - 1)
  if low == high:
    high += 0.001  # (a ramp of one dimension)
  ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
  return inv_freq / yarn.factor * ramp + inv_freq * (1 - ramp)
