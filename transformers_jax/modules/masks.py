"""What a query may attend, as data: the attention pattern, described per token rather than per
(query, key) pair.

`AttentionMask` holds everything that decides which keys a query may attend: the pattern
(`causal`, a bidirectional `prefix`, a sliding `window`, `chunk`s) and the per-token arrays
([B, T] / [B, S]) it is evaluated on: segment ids (packed rows, document boundaries), key
validity (padding) and, optionally, the true positions of queries and keys (what a causal mask
compares when a sequence is permuted or split over devices). A model's stack sets the pattern
(its family's, and a Task's inputs such as a prefix-LM's prefix lengths); every attention
implementation (einsum, fused/cuDNN, flash, splash, the ring and the KV cache) reads it from
here, none takes a pattern of its own. Blockwise kernels (flash, splash, ring) evaluate it per
block and never build a T x S mask; the reference paths build the dense [B, 1, T, S] boolean
mask with `dense`.

A query i may attend key j when all of these hold (each only where its fields are set):
  q_segments[b, i] == kv_segments[b, j]     (kv_segments default to q_segments: self-attention)
  kv_valid[b, j]
  and, when the attention is `causal`: kv_positions[b, j] <= q_positions[b, i] if positions
  are set, else j <= i (queries and keys aligned at the start) -- or, with a `prefix`, the key
  lies in its row's prefix: kv_positions[b, j] < prefix[b] (the prefix LM: bidirectional over
  the prefix, causal after it);
  and, with a sliding `window`: q_positions[b, i] - kv_positions[b, j] < window (a query sees
  only the keys fewer than `window` positions back);
  and, with `chunk` C: q_positions[b, i] // C == kv_positions[b, j] // C (a query sees only its
  own chunk of C positions: Llama 4's chunked attention).
The paths that mask by index give a mask index positions first (`with_index_positions`) when a
window, prefix or chunk needs positions.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from transformers_jax.modules.positions import index_positions


@flax.struct.dataclass
class AttentionMask:
  """Per-token mask fields (all optional, batch-major); a pytree, so it passes through jit,
  nn.scan and remat like any array."""

  q_segments: jax.Array | None = None  # [B, T] int: segment id of each query
  kv_segments: jax.Array | None = None  # [B, S] int: of each key; None = q_segments
  kv_valid: jax.Array | None = None  # [B, S] bool: False = a padding key nobody attends
  q_positions: jax.Array | None = None  # [B, T] int: a query's position (causal order)
  kv_positions: jax.Array | None = None  # [B, S] int: a key's position (causal order)
  window: jax.Array | None = None  # int scalar: keys this many positions back or more are masked
  prefix: jax.Array | None = None  # [B] int: keys at positions below it are every query's
  # int scalar: a query sees only its own chunk of this many positions (traced, as the window
  # is, so that the layers of a scan may differ; an int given here is taken as one, 0 as none)
  chunk: jax.Array | None = None
  causal: bool = flax.struct.field(pytree_node=False, default=False)  # no later key (see above)

  @property
  def key_segments(self):
    return self.q_segments if self.kv_segments is None else self.kv_segments

  @property
  def has_positions(self) -> bool:
    return self.q_positions is not None

  @property
  def needs_positions(self) -> bool:
    """Whether evaluating the pattern compares positions (a window, a prefix or chunks), so
    that the paths masking by index must give it index positions first."""
    return self.window is not None or self.prefix is not None or self.chunk is not None

  def __post_init__(self):
    if isinstance(self.chunk, int):  # (flax dataclasses are frozen: set as the field's type)
      object.__setattr__(self, "chunk", jnp.asarray(self.chunk, jnp.int32) if self.chunk else None)
    if (self.q_positions is None) != (self.kv_positions is None):
      raise ValueError("AttentionMask: give both q_positions and kv_positions, or neither")
    if self.kv_segments is not None and self.q_segments is None:
      raise ValueError("AttentionMask: kv_segments need q_segments (the queries' segment ids)")

  def dense(self, causal: bool = False, length: int | None = None):
    """The boolean mask [B, 1, T or 1, S] (True = may attend), or None when nothing masks.

    The causal order (`causal` or the mask's own) goes in only when positions are set: index
    causality is the caller's, as `attend`'s reference path applies it itself. `length` (T)
    is needed only when no field has a query axis."""
    out = None

    def both(a, b):
      return b if a is None else a & b

    if self.kv_valid is not None:
      out = self.kv_valid.astype(bool)[:, None, None, :]
    if self.q_segments is not None:
      out = both(out, self.q_segments[:, None, :, None] == self.key_segments[:, None, None, :])
    q_pos, kv_pos = self.q_positions, self.kv_positions
    if self.has_positions:
      q_pos, kv_pos = q_pos[:, None, :, None], kv_pos[:, None, None, :]
    if (causal or self.causal) and self.has_positions:
      order = kv_pos <= q_pos
      if self.prefix is not None:
        order = order | (kv_pos < self.prefix[:, None, None, None])
      out = both(out, order)
    if self.window is not None and self.has_positions:
      out = both(out, q_pos - kv_pos < self.window)
    if self.chunk is not None and self.has_positions:
      out = both(out, q_pos // self.chunk == kv_pos // self.chunk)
    if out is not None and length is not None and out.shape[2] == 1:
      out = jnp.broadcast_to(out, out.shape[:2] + (length, out.shape[3]))
    return out


def with_index_positions(mask: AttentionMask, T: int, S: int) -> AttentionMask:
  """`mask` with positions 0 .. T-1 for its queries and 0 .. S-1 for its keys where it has none
  (what a sliding window needs to be evaluated)."""
  if mask.has_positions:
    return mask
  return mask.replace(q_positions=index_positions(T), kv_positions=index_positions(S))


def with_pattern(mask, causal: bool, prefix=None, chunk: int = 0):
  """`mask` (an AttentionMask or None) carrying a stack's attention pattern: `causal`, a
  bidirectional `prefix` ([B] ints, or None) and `chunk` (0: none). Always an AttentionMask, so
  that every block and kernel reads the pattern from it."""
  mask = mask if mask is not None else AttentionMask()
  fields = dict(causal=bool(causal))
  if chunk:
    fields["chunk"] = jnp.asarray(chunk, jnp.int32)
  if prefix is not None:
    fields["prefix"] = jnp.asarray(prefix, jnp.int32)
  return mask.replace(**fields)


def with_window(mask, window, chunk=None):
  """`mask` (an AttentionMask or None) limited to a sliding `window` and to `chunk`s (a block's
  own, modules/layer_types.py; None: unchanged)."""
  if window is None and chunk is None:
    return mask
  mask = mask if mask is not None else AttentionMask()
  if window is not None:
    mask = mask.replace(window=jnp.asarray(window, jnp.int32))
  if chunk is not None:
    mask = mask.replace(chunk=jnp.asarray(chunk, jnp.int32))
  return mask


def as_dense(mask, causal: bool = False):
  """A dense boolean mask (or None) from an AttentionMask, a dense mask or None (the KV cache's
  path, whose slots carry their own causal order: only the mask's other fields go in)."""
  if isinstance(mask, AttentionMask):
    return mask.replace(causal=False, prefix=None).dense(causal)
  return mask


def is_causal(mask, causal: bool = False) -> bool:
  """Whether attention under `mask` is causal: by the mask's pattern, or by `causal` (a caller
  of the attention functions that passes a dense mask or None, or says so itself)."""
  return bool(causal) or (isinstance(mask, AttentionMask) and mask.causal)


def token_mask(
    key_valid=None,
    segments=None,
    key_segments=None,
    positions=None,
    key_positions=None,
):
  """The AttentionMask of a family's inputs, or None when none is given: `key_valid` [B, S]
  0/1 (1 = a real token; only keys are masked, so rows of padded queries stay finite and the
  loss ignores them), `segments` [B, T] and `key_segments` [B, S] packed segment ids (padding
  shares id 0, so its rows attend only padding), `positions` / `key_positions` for a causal
  mask by true position."""
  if all(x is None for x in (key_valid, segments, positions)):
    return None
  return AttentionMask(
      q_segments=segments,
      kv_segments=None if segments is None else key_segments,
      kv_valid=None if key_valid is None else key_valid.astype(bool),
      q_positions=positions,
      kv_positions=positions if key_positions is None else key_positions,
  )
