"""Position schemes: where a model's `positions` setting enters, in one object per scheme.

A scheme may do any of three things, and the model asks it at each place:
  * add to the embeddings (`embedding_table`, `add_to_embeddings`: learned, sinusoidal);
  * rotate queries and keys of self-attention (`rotate`: RoPE);
  * give every self-attention a score bias b(query position, key position, head), added to
    q.k / sqrt(K) before the softmax (`score_bias`: T5's bucketed relative bias, ALiBi). The
    bias is a `ScoreBias`, a pytree that every attention path evaluates for the pairs it scores
    (einsum and the fused call whole, flash per block, the KV cache per slot, the context axis
    per shard or ring step), so no path needs to know which scheme made it.
Stacks make the bias once and hand it to each block (T5 shares one table across the layers of
a stack); cross-attention never takes one.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformers_jax.modules import inits, yarn
from transformers_jax.modules.common import dtype_of, normal


def sinusoidal_table(length: int, d_model: int, halves: bool = False) -> np.ndarray:
  """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) (Vaswani et al.).

  Columns interleave sine and cosine as in the paper: column 2i is sin, column 2i + 1 is cos.
  With `halves` the same values lie as Marian lays them: all sines, then all cosines.
  """
  pos = np.arange(length, dtype=np.float64)[:, None]
  i = np.arange(d_model // 2, dtype=np.float64)[None, :]
  angle = pos / 10000.0 ** (2.0 * i / d_model)
  if halves:
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1).astype(np.float32)
  table = np.empty((length, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle)
  return table.astype(np.float32)


def parse_rope_scaling(text: str):
  """model.rope_scaling "llama3:FACTOR,LOW,HIGH,ORIGINAL_LENGTH" -> the four numbers, a
  "yarn:..." one -> its yarn.Yarn (None for ""); ValueError for anything else."""
  if not text:
    return None
  kind, _, numbers = text.partition(":")
  if kind == "yarn":
    return yarn.parse(numbers)
  parts = numbers.split(",")
  if kind != "llama3" or len(parts) != 4:
    raise ValueError(text)
  factor, low, high, original = (float(p) for p in parts)
  if not (factor >= 1 and 0 < low < high and original >= 1 and original == int(original)):
    raise ValueError(text)
  return factor, low, high, int(original)


def rope_frequencies(head_dim: int, theta: float, scaling: str = "") -> np.ndarray:
  """theta^(-2i/head_dim), i < head_dim/2, with YaRN's or Llama 3.1's scaling ("llama3:8,1,4,8192"):
  wavelengths shorter than ORIGINAL/HIGH are kept, those longer than ORIGINAL/LOW are divided
  by FACTOR (slowed down), and those between are blended linearly in ORIGINAL / wavelength."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  parsed = parse_rope_scaling(scaling)
  if isinstance(parsed, yarn.Yarn):  # YaRN (DeepSeek-V3): modules/yarn.py
    return yarn.frequencies(head_dim, theta, parsed)
  if parsed is not None:
    factor, low, high, original = parsed
    wavelength = 2 * np.pi / inv_freq
    blend = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)
    scaled = (1 - blend) * inv_freq / factor + blend * inv_freq
    inv_freq = np.where(wavelength < original / high, inv_freq, scaled)
  return inv_freq.astype(np.float32)


def rope_angles(positions, head_dim: int, theta: float, scaling: str = ""):
  """Angles [..., head_dim/2]: position * frequency i (rope_frequencies)."""
  return positions.astype(jnp.float32)[..., None] * rope_frequencies(head_dim, theta, scaling)


def apply_rope(x, positions, theta: float, scaling: str = ""):
  """Rotate feature pairs (i, i + K/2) of x [B, T, N, K] by angle(position, i).

  The half-split pairing (as in GPT-NeoX and LLaMA) rather than adjacent pairs: the two are the
  same rotation up to a fixed permutation of features, so q.k depends only on the offset either way.
  """
  angles = rope_angles(positions, x.shape[-1], theta, scaling)[:, :, None, :]  # [B, T, 1, K/2]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  parsed = parse_rope_scaling(scaling)
  if isinstance(parsed, yarn.Yarn):  # YaRN scales the rotated features too
    sin, cos = sin * yarn.attention_factor(parsed), cos * yarn.attention_factor(parsed)
  xf = x.astype(jnp.float32)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def relative_bucket(relative, bidirectional: bool, num_buckets: int, max_distance: int):
  """T5's bucket of each offset `relative` = key position - query position (int array).

  Half the buckets (or, bidirectional, half of each direction's half) hold exact offsets 0, 1,
  …; the rest cover offsets up to `max_distance` in logarithmically growing ranges, and every
  farther offset shares the last bucket. Causal (not bidirectional) buckets count only keys at
  or before the query; later keys share bucket 0 with the query itself (a causal mask hides
  them anyway)."""
  relative = relative.astype(jnp.int32)
  bucket = jnp.zeros_like(relative)
  if bidirectional:
    num_buckets //= 2
    bucket = jnp.where(relative > 0, num_buckets, 0)
    distance = jnp.abs(relative)
  else:
    distance = jnp.maximum(-relative, 0)
  exact = num_buckets // 2
  scaled = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / exact) / math.log(
      max_distance / exact
  )
  far = exact + (scaled * (num_buckets - exact)).astype(jnp.int32)
  far = jnp.minimum(far, num_buckets - 1)
  return bucket + jnp.where(distance < exact, distance, far)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi's per-head slopes (Press et al., 2022): the geometric sequence 2^(-8 i / n), i = 1..n,
  for n heads a power of two; otherwise those of the nearest smaller power of two followed by
  every other slope of the next power of two."""

  def powers(n):
    return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

  below = 2 ** int(math.floor(math.log2(num_heads)))
  slopes = powers(below) + powers(2 * below)[0::2][: num_heads - below]
  return np.asarray(slopes, np.float32)


@flax.struct.dataclass
class ScoreBias:
  """An additive attention-score bias as a function of query and key positions.

  `weights`: T5's table [num_buckets, H] (learned) or ALiBi's slopes [H] (constants). Called
  with q_positions [B or 1, T] and k_positions [B or 1, S], it returns [B or 1, H, T, S]
  float32. A pytree: it passes through jit, scan, remat, shard_map and custom VJPs like an
  array; its weights always end with the heads axis (what a split over heads slices)."""

  weights: jax.Array
  kind: str = flax.struct.field(pytree_node=False, default="t5")  # t5 | alibi
  bidirectional: bool = flax.struct.field(pytree_node=False, default=True)
  max_distance: int = flax.struct.field(pytree_node=False, default=128)

  @property
  def num_heads(self) -> int:
    return self.weights.shape[-1]

  def __call__(self, q_positions, k_positions):
    relative = k_positions[:, None, :] - q_positions[:, :, None]  # [B, T, S]
    if self.kind == "alibi":
      distance = jnp.abs(relative).astype(jnp.float32)[:, None]
      return -self.weights.astype(jnp.float32)[None, :, None, None] * distance
    bucket = relative_bucket(relative, self.bidirectional, self.weights.shape[0], self.max_distance)
    return jnp.moveaxis(self.weights.astype(jnp.float32)[bucket], -1, 1)

  def block(self, q_positions, k_positions, groups: int):
    """The bias laid out as grouped-query attention reads it: [B or 1, G, H/G, T, S]."""
    b = self(q_positions, k_positions)
    return b.reshape(b.shape[0], groups, self.num_heads // groups, *b.shape[2:])


def index_positions(length: int, start=0):
  """Positions start, start + 1, … as a [1, length] int32 array (a sequence in index order)."""
  return (start + jnp.arange(length, dtype=jnp.int32))[None]


def _no_splash(c):
  """A score bias cannot enter splash's kernel: refuse an explicit choice of it."""
  if c.attention_impl == "splash":
    return (
        "attention_impl",
        "'splash'",
        f"splash's kernel takes no score bias (model.positions={c.positions}): use flash, or "
        "auto (which runs flash for it)",
    )
  return None


class PositionScheme:
  """No positional information (`none`): attention is then permutation-equivariant."""

  name = "none"

  def embedding_table(self, c):
    """The embedder's learned table (an nn.Module made in its setup), or None."""
    return None

  def add_to_embeddings(self, c, x, positions, table):
    return x

  def rotate(self, c, q, k, positions):
    return q, k

  def score_bias(self, c, stack: nn.Module, causal: bool) -> ScoreBias | None:
    """The bias a stack's self-attentions add (parameters made in `stack`), or None."""
    return None

  def config_problem(self, c) -> tuple[str, str, str] | None:
    return None


class Learned(PositionScheme):
  """A trained table of max_len rows added to the token embeddings (BERT, GPT-2); with
  model.position_offset = n, n more rows come first and position p reads row p + n (BART's 2)."""

  name = "learned"

  def embedding_table(self, c):
    return nn.Embed(
        c.seq_len_max + c.position_offset,
        c.d_model,
        dtype=dtype_of(c.dtype),
        param_dtype=dtype_of(c.param_dtype),
        embedding_init=normal(inits.embedding_std(c), ("position", "embed")),
    )

  def add_to_embeddings(self, c, x, positions, table):
    return x + table(positions + c.position_offset if c.position_offset else positions)


class Sinusoidal(PositionScheme):
  """The 2017 Transformer's fixed sinusoids added to the embeddings."""

  name = "sinusoidal"
  halves = False

  def add_to_embeddings(self, c, x, positions, table):
    values = sinusoidal_table(c.seq_len_max, c.d_model, self.halves)
    return x + jnp.asarray(values, x.dtype)[positions]

  def config_problem(self, c):
    if c.d_model % 2:
      return "d_model", str(c.d_model), "sinusoidal positions need an even d_model"
    return None


class SinusoidalHalves(Sinusoidal):
  """The same fixed sinusoids with all sines before all cosines (Marian's layout)."""

  name = "sinusoidal_halves"
  halves = True


class Rotary(PositionScheme):
  """RoPE (Su et al.): queries and keys rotated by their positions, base wavelength rope_theta."""

  name = "rope"

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
          f"{yarn.FORMAT} (DeepSeek-V3: {yarn.EXAMPLE}) or ''"
      )
      return "rope_scaling", repr(c.rope_scaling), fix
    return None


class RelativeBias(PositionScheme):
  """T5's relative attention bias (Raffel et al.): a learned scalar per head and bucket of the
  offset key - query (model.relative_buckets buckets, log-spaced up to
  model.relative_max_distance), one table per stack shared by its layers; bidirectional buckets
  in an encoder, causal ones in a decoder."""

  name = "t5"

  def score_bias(self, c, stack, causal):
    table = stack.param(
        "relative_bias",
        normal(c.init_std, ("relative_buckets", "heads")),
        (c.relative_buckets, c.num_heads),
        dtype_of(c.param_dtype),
    )
    return ScoreBias(table, "t5", not causal, c.relative_max_distance)

  def config_problem(self, c):
    if _no_splash(c):
      return _no_splash(c)
    if c.relative_buckets < 4 or c.relative_buckets % 2:
      return "relative_buckets", str(c.relative_buckets), "use an even number >= 4 (T5: 32)"
    if c.relative_max_distance <= c.relative_buckets // 2:
      return (
          "relative_max_distance",
          str(c.relative_max_distance),
          f"must exceed relative_buckets / 2 = {c.relative_buckets // 2} (T5: 128)",
      )
    return None


class ALiBi(PositionScheme):
  """ALiBi (Press et al.): no embeddings; each head h adds -slope_h * |query - key| to its scores
  (fixed slopes, alibi_slopes)."""

  name = "alibi"

  def score_bias(self, c, stack, causal):
    return ScoreBias(jnp.asarray(alibi_slopes(c.num_heads)), "alibi", not causal)

  def config_problem(self, c):
    return _no_splash(c)


POSITION_SCHEMES = {
    s.name: s()
    for s in (Sinusoidal, SinusoidalHalves, Learned, Rotary, RelativeBias, ALiBi, PositionScheme)
}


def position_scheme(c) -> PositionScheme:
  return POSITION_SCHEMES[c.positions]


class DecodeCounter(nn.Module):
  """Positions of the tokens fed in this decode call: [index, index + T); advances the index."""

  @nn.compact
  def __call__(self, batch: int, length: int):
    initialised = self.has_variable("cache", "index")
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    start = index.value
    if initialised:
      index.value = start + length
    return jnp.broadcast_to(start + jnp.arange(length, dtype=jnp.int32), (batch, length))
