"""Per-layer attention patterns: what each block of a stack attends and how it rotates.

`model.layer_types` is a comma-separated period of entries of LAYER_TYPES, repeated over the
blocks (block i takes entry i mod n; the period need not divide the depth: Gemma 3 1B has 26
layers over a period of 6). An entry says two things about its blocks:
  * which keys a query attends: every earlier one (`full`), those fewer than
    `model.sliding_window` positions back (`sliding`), or those of its own chunk of
    `model.attention_chunk` positions (`chunked`, Llama 4's local layers);
  * how queries and keys are rotated: RoPE at `model.rope_theta` with `model.rope_scaling`
    (`global`), RoPE at `model.rope_local_theta` without scaling (`local`: Gemma 3's and OLMo 3's
    sliding layers; with rope_local_theta 0 as the global layers), or not at all (`none`: NoPE,
    SmolLM3's every fourth layer, Llama 4's global layers).
Without layer_types the blocks follow `model.sliding_window` and `model.sliding_every` (every
sliding_every-th block from the first slides), which is the period `sliding` + (n - 1) x
`full`. Two settings act on the NoPE blocks alone (Llama 4's): the attention temperature
(`model.attention_temperature_floor`, `temperature`) and, with `model.qk_norm_rope_only`, the
absence of the q/k norm (`nope_only` picks per block, traced under a scan).

In a looped stack each block's window, chunk and frequencies are Python values, so the KV cache
of a sliding or chunked block is a ring of that many slots (modules/cache.py). Under nn.scan the
block index is traced: a window or chunk that differs between layers is selected from a table
(an int32 maximum standing for "none"), as are the RoPE frequencies (zeros for NoPE, which
rotate by nothing), and the cache keeps one slot per position in every layer.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from transformers_jax.modules.positions import rope_frequencies

NONE = int(np.iinfo(np.int32).max)  # a traced window or chunk that masks nothing


@dataclasses.dataclass(frozen=True)
class LayerType:
  name: str
  attention: str  # full | sliding | chunked
  rope: str  # global | local | none
  about: str


LAYER_TYPES = {
    t.name: t
    for t in (
        LayerType("full", "full", "global", "every earlier key; RoPE at rope_theta"),
        LayerType(
            "sliding",
            "sliding",
            "local",
            "keys fewer than sliding_window positions back; RoPE at rope_local_theta (Gemma 3)",
        ),
        LayerType(
            "chunked",
            "chunked",
            "global",
            "the query's own chunk of attention_chunk positions; RoPE at rope_theta (Llama 4)",
        ),
        LayerType("nope", "full", "none", "every earlier key; no rotation (NoPE: SmolLM3)"),
        LayerType(
            "sliding_nope", "sliding", "none", "keys fewer than sliding_window back; no rotation"
        ),
    )
}


def pattern(c) -> tuple[LayerType, ...]:
  """The period of layer types the blocks repeat (model.layer_types, or what sliding_window and
  sliding_every say)."""
  if c.layer_types:
    return tuple(LAYER_TYPES[name.strip()] for name in c.layer_types.split(","))
  if c.sliding_window:
    return (LAYER_TYPES["sliding"],) + (LAYER_TYPES["full"],) * (c.sliding_every - 1)
  return (LAYER_TYPES["full"],)


def names(c, layers: int) -> list[str]:
  """Each of `layers` blocks' layer type."""
  period = pattern(c)
  return [period[i % len(period)].name for i in range(layers)]


def compress(types: list[str]) -> str:
  """The shortest period that repeats into `types` (one name per layer), comma-separated."""
  for n in range(1, len(types) + 1):
    if all(t == types[i % n] for i, t in enumerate(types)):
      return ",".join(types[:n])
  return ""


def _inv_freq(c, kind: str) -> np.ndarray:
  half = c.head_width // 2
  if kind == "none":
    return np.zeros(half, np.float32)
  if kind == "local" and c.rope_local_theta:
    return rope_frequencies(c.head_width, c.rope_local_theta)
  return rope_frequencies(c.head_width, c.rope_theta, c.rope_scaling)


def _select(values: list, index, default):
  """values[index mod n], a Python value when all agree or the index is static, else traced."""
  if all(v == values[0] for v in values):
    return values[0]
  if isinstance(index, int):
    return values[index % len(values)]
  table = jnp.asarray([default if v is None else v for v in values], jnp.int32)
  return table[index % len(values)]


@dataclasses.dataclass(frozen=True)
class LayerAttention:
  """One block's window and chunk (None: none; ints in a looped stack, maybe traced under a
  scan) and RoPE frequencies (None: the position scheme's own rotation)."""

  window: object = None
  chunk: object = None
  inv_freq: object = None
  rotates: object = True  # whether RoPE rotates this block (False: NoPE; traced under a scan)


def layer_attention(c, index, causal: bool) -> LayerAttention:
  """What block `index` (an int, or traced under nn.scan) of a stack attends and rotates by.
  Windows and chunks apply to causal stacks only."""
  period = pattern(c)
  window = chunk = None
  if causal:
    windows = [c.sliding_window if t.attention == "sliding" else None for t in period]
    chunks = [c.attention_chunk if t.attention == "chunked" else None for t in period]
    window, chunk = _select(windows, index, NONE), _select(chunks, index, NONE)
  inv_freq = None
  ropes = [t.rope if t.rope != "local" or c.rope_local_theta else "global" for t in period]
  if c.positions == "rope" and any(r != "global" for r in ropes):
    if isinstance(index, int) or all(r == ropes[0] for r in ropes):
      inv_freq = _inv_freq(c, ropes[0] if not isinstance(index, int) else ropes[index % len(ropes)])
    else:
      table = jnp.asarray(np.stack([_inv_freq(c, r) for r in ropes]))
      inv_freq = table[index % len(ropes)]
  rotated = [r != "none" for r in ropes]
  rotates = rotated[0]
  if not all(r == rotates for r in rotated):
    rotates = rotated[index % len(rotated)] if isinstance(index, int) else None
    rotates = jnp.asarray(rotated)[index % len(rotated)] if rotates is None else rotates
  return LayerAttention(window, chunk, inv_freq, c.positions == "rope" and rotates)


def nope_only(layer, transformed, plain):
  """`transformed` on a block RoPE does not rotate (NoPE), `plain` on the others (`layer`: its
  LayerAttention, or None for the defaults: every block rotates)."""
  rotates = True if layer is None else layer.rotates
  if isinstance(rotates, bool):
    return plain if rotates else transformed
  return jnp.where(rotates, plain, transformed)


def temperature(c, q, positions):
  """Llama 4's attention temperature for long contexts (attn_temperature_tuning, after Nakanishi
  2025, arXiv 2501.19399): queries q [B, T, N, K] at positions p [B, T] times
  1 + attention_temperature_scale * log(1 + floor((p + 1) / attention_temperature_floor)), in
  float32; 1 below the floor, so short contexts are untouched."""
  p = positions.astype(jnp.float32)
  scale = jnp.log1p(jnp.floor((p + 1.0) / c.attention_temperature_floor))
  scale = scale * c.attention_temperature_scale + 1.0
  return (q.astype(jnp.float32) * scale[:, :, None, None]).astype(q.dtype)


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of the first layer-pattern setting that cannot work, or None."""
  if c.layer_types:
    entries = [name.strip() for name in c.layer_types.split(",")]
    unknown = [name for name in entries if name not in LAYER_TYPES]
    if unknown:
      fix = f"a comma-separated period of {', '.join(LAYER_TYPES)} (e.g. sliding,full)"
      return "layer_types", repr(c.layer_types), fix
    if c.sliding_every != 1:
      fix = "layer_types says which blocks slide: leave sliding_every at 1"
      return "sliding_every", str(c.sliding_every), fix
  if c.attention_chunk < 0:
    return "attention_chunk", str(c.attention_chunk), "must be >= 0 (0: none)"
  if c.rope_local_theta < 0:
    return "rope_local_theta", str(c.rope_local_theta), "must be >= 0 (0: rope_theta)"
  period = pattern(c)
  kinds = {t.attention for t in period}
  ropes = {t.rope for t in period}
  own_ropes = {r for r in ropes if r != "global" and (r != "local" or c.rope_local_theta)}
  if c.rope_scaling.startswith("yarn:") and own_ropes:
    fix = "YaRN scales one RoPE for every block: drop the NoPE/local-RoPE entries or rope_scaling"
    return "rope_scaling", repr(c.rope_scaling), fix
  if c.layer_types and c.sliding_window and "sliding" not in kinds:
    fix = "no entry of layer_types slides: add sliding ones, or set sliding_window=0"
    return "sliding_window", str(c.sliding_window), fix
  if "sliding" in kinds and not c.sliding_window:
    return "sliding_window", "0", "layer_types has sliding entries: give their window, e.g. 4096"
  if "chunked" in kinds and not c.attention_chunk:
    return "attention_chunk", "0", "layer_types has chunked entries: give their chunk, e.g. 8192"
  if c.attention_chunk and "chunked" not in kinds:
    fix = "only chunked layers read it: add chunked to model.layer_types, or set 0"
    return "attention_chunk", str(c.attention_chunk), fix
  if kinds - {"full"} and c.family in ("encoder", "vit"):
    fix = "sliding and chunked layers are for causal stacks: use full (or nope) entries"
    return "layer_types", repr(c.layer_types), fix
  if ropes - {"global", "local"} and c.positions != "rope":
    fix = "NoPE layers leave out RoPE: they need model.positions=rope"
    return "layer_types", repr(c.layer_types), fix
  if c.attention_temperature_floor < 0:
    fix = "must be >= 0 (0: off; Llama 4: 8192)"
    return "attention_temperature_floor", str(c.attention_temperature_floor), fix
  nope = c.positions == "rope" and "none" in ropes
  if c.attention_temperature_scale != 0.1 and not c.attention_temperature_floor:
    fix = "only the temperature reads it: set attention_temperature_floor (Llama 4: 8192)"
    return "attention_temperature_scale", str(c.attention_temperature_scale), fix
  for field in ("attention_temperature_floor", "qk_norm_rope_only"):
    if getattr(c, field) and not nope:
      fix = "it concerns NoPE layers: add nope entries to model.layer_types (RoPE), or unset it"
      return field, str(getattr(c, field)), fix
  if c.qk_norm_rope_only and not (c.qk_norm and c.qk_norm_kind == "l2"):
    fix = "only the parameter-free l2 norm can skip blocks: qk_norm=True, qk_norm_kind=l2"
    return "qk_norm_rope_only", "True", fix
  if c.rope_local_theta and (c.positions != "rope" or "local" not in ropes):
    fix = "only the sliding layers of a RoPE model read it: add sliding entries, or set 0"
    return "rope_local_theta", str(c.rope_local_theta), fix
  return None
