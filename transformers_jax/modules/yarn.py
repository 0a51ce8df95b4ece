"""YaRN's RoPE scaling (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large
Language Models") with DeepSeek-V3's settings (`model.rope_scaling=yarn:40,4096,32,1,1,1`).

With FACTOR s, ORIGINAL_LENGTH L, BETA_FAST b_f and BETA_SLOW b_s, each frequency theta^(-2i/d)
of a d-wide rotation is blended between itself (extrapolated) and itself / s (interpolated):
the dimensions that turn more than b_f times over L positions keep their frequency, those that
turn fewer than b_s times are divided by s, and a linear ramp over dimension indices
[floor(low), ceil(high)] lies between, where low and high are the dimensions that turn b_f and
b_s times: d log(L / (2 pi b)) / (2 log theta). The rotated features are multiplied by
m(s, MSCALE) / m(s, MSCALE_ALL_DIM) (m(s) alone where either is 0), m(s, a) = 0.1 a ln(s) + 1
(1 for s <= 1); multi-head latent attention (DeepSeek-V2/V3) also multiplies every score by
m(s, MSCALE_ALL_DIM)^2 (`softmax_scale`). These are the formulas transformers' `yarn` RoPE and
its DeepSeek-V3 attention compute.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

FORMAT = "yarn:FACTOR,ORIGINAL_LENGTH,BETA_FAST,BETA_SLOW,MSCALE,MSCALE_ALL_DIM"
EXAMPLE = "yarn:40,4096,32,1,1,1"  # DeepSeek-V3's


@dataclasses.dataclass(frozen=True)
class Yarn:
  factor: float
  original: int
  beta_fast: float
  beta_slow: float
  mscale: float
  mscale_all_dim: float

  def text(self) -> str:
    """The model.rope_scaling string of these settings."""
    numbers = (self.factor, self.original, self.beta_fast, self.beta_slow, self.mscale)
    numbers += (self.mscale_all_dim,)
    return "yarn:" + ",".join(format(float(x), ".12g") for x in numbers)


def parse(numbers: str) -> Yarn:
  """The six numbers after "yarn:" -> Yarn; ValueError for anything else."""
  parts = numbers.split(",")
  if len(parts) != 6:
    raise ValueError(numbers)
  factor, original, fast, slow, mscale, mscale_all_dim = (float(p) for p in parts)
  if not all(math.isfinite(x) for x in (factor, original, fast, slow, mscale, mscale_all_dim)):
    raise ValueError(numbers)
  if not (factor >= 1 and original >= 1 and original == int(original) and fast > slow > 0):
    raise ValueError(numbers)
  if mscale < 0 or mscale_all_dim < 0:
    raise ValueError(numbers)
  return Yarn(factor, int(original), fast, slow, mscale, mscale_all_dim)


def get_mscale(scale: float, mscale: float = 1.0) -> float:
  """YaRN's attention temperature m(s, a) = 0.1 a ln(s) + 1 (1 for s <= 1)."""
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def attention_factor(y: Yarn) -> float:
  """What the rotated features (the cosine and sine) are multiplied by."""
  if y.mscale and y.mscale_all_dim:
    return get_mscale(y.factor, y.mscale) / get_mscale(y.factor, y.mscale_all_dim)
  return get_mscale(y.factor)


def softmax_scale(y: Yarn) -> float:
  """What multi-head latent attention multiplies its scores by besides 1/sqrt(head width)."""
  return get_mscale(y.factor, y.mscale_all_dim) ** 2 if y.mscale_all_dim else 1.0


def frequencies(head_dim: int, theta: float, y: Yarn) -> np.ndarray:
  """The inverse frequencies of a `head_dim`-wide rotation with base `theta` under YaRN."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
  extrapolated = theta**-exponents
  interpolated = extrapolated / y.factor

  def dimension(turns):  # the dimension index that turns `turns` times over `original`
    return head_dim * math.log(y.original / (turns * 2 * math.pi)) / (2 * math.log(theta))

  low = max(math.floor(dimension(y.beta_fast)), 0)
  high = min(math.ceil(dimension(y.beta_slow)), head_dim - 1)
  if low == high:
    high += 0.001  # (a ramp of width 0 would divide by zero)
  ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
  return (interpolated * ramp + extrapolated * (1.0 - ramp)).astype(np.float32)
