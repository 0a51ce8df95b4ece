"""RoPE settings of a config.json <-> model.rope_theta and model.rope_scaling, for the model types
that may carry YaRN scaling (gpt_oss, qwen3_moe): read as the hub's files write them
(`rope_theta` + `rope_scaling`) or as transformers 5 does (`rope_parameters`), written the
hub's way. Llama 3.1's "llama3" scaling reads as interop/llama.py reads it."""

from __future__ import annotations

from collections.abc import Mapping

from transformers_jax.interop.common import UnsupportedArchitecture
from transformers_jax.modules.positions import parse_rope_scaling
from transformers_jax.modules.yarn import mscale, parse_yarn


def _number(x) -> str:
  return format(float(x), ".17g")


def read_rope(
    hf: Mapping, where: str, default_theta: float, default_rope: Mapping | None = None
) -> tuple[float, str]:
  """(rope_theta, model.rope_scaling) of a config.json; `default_rope`: the scaling the config
  class assumes when the file names none (gpt-oss: YaRN)."""
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or default_rope or {}
  theta = float(rope.get("rope_theta", hf.get("rope_theta", default_theta)))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if rope.get("partial_rotary_factor", 1.0) != 1.0:
    raise UnsupportedArchitecture(
        f"{where}: partial_rotary_factor={rope['partial_rotary_factor']} is not supported (RoPE "
        "rotates every feature of a head here): use a checkpoint without it"
    )
  if kind == "default":
    return theta, ""
  if kind == "llama3":
    numbers = [rope[k] for k in ("factor", "low_freq_factor", "high_freq_factor")]
    numbers.append(rope["original_max_position_embeddings"])
    return theta, "llama3:" + ",".join(format(float(x), ".12g") for x in numbers)
  if kind != "yarn":
    raise UnsupportedArchitecture(
        f"{where}: RoPE scaling {kind!r} is not supported (only 'yarn' and 'llama3'): use a "
        "checkpoint without it"
    )
  original = rope["original_max_position_embeddings"]
  factor = rope.get("factor") or hf["max_position_embeddings"] / original
  attention = rope.get("attention_factor")
  if attention is None and rope.get("mscale") and rope.get("mscale_all_dim"):
    attention = mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
  numbers = [factor, rope.get("beta_fast") or 32, rope.get("beta_slow") or 1, original]
  numbers.append(1 if rope.get("truncate", True) else 0)
  if attention is not None:
    numbers.append(attention)
  text = "yarn:" + ",".join(_number(x) for x in numbers)
  try:
    parse_yarn(text)
  except ValueError:
    raise UnsupportedArchitecture(
        f"{where}: rope_scaling {dict(rope)} is not a YaRN setting this model can hold (factor >= "
        "1, beta_fast > beta_slow > 0): use the config.json saved with the weights"
    ) from None
  return theta, text


def write_rope(c, none=None) -> dict:
  """The config.json entries rope_theta and rope_scaling of `c` (`none` without scaling: null,
  or {"rope_type": "default"} where the config class would assume a scaling of its own)."""
  yarn = parse_yarn(c.rope_scaling)
  scaling = none
  if yarn:
    scaling = dict(
        rope_type="yarn",
        factor=yarn.factor,
        beta_fast=yarn.beta_fast,
        beta_slow=yarn.beta_slow,
        original_max_position_embeddings=yarn.original,
        truncate=yarn.truncate,
    )
    if yarn.attention_factor is not None:
      scaling["attention_factor"] = yarn.attention_factor
  elif c.rope_scaling:
    factor, low, high, original = parse_rope_scaling(c.rope_scaling)
    scaling = dict(
        rope_type="llama3",
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    )
  return dict(rope_theta=c.rope_theta, rope_scaling=scaling)
