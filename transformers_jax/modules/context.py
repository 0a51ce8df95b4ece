"""Context parallelism: the tokens of each sequence split over the `context` mesh axis.

Activations [B, T, ...] have their T axis (logical name `act_length`) split over `context`, so
every device holds T/N tokens of each of its sequences, and so do the feed-forward layers, the
norms and the head. Attention needs every key for every query: `attend_over_context` keeps the
queries on their device and all-gathers the keys and values (and the per-token mask fields) over
`context` inside a `shard_map`; their gradients come back as a reduce-scatter. Per device the
score blocks then cover T/N queries x T keys: an Nth of the whole.

Causal load balancing (zig-zag): with N devices the sequence is cut into 2N chunks and device i
holds chunks i and 2N-1-i, so every device has as many early queries (few keys to attend) as
late ones (many). A causal stack permutes its inputs (tokens, positions, segment ids, padding)
into that order once (`to_zigzag`) and its hidden states back once at the end (`from_zigzag`);
causal masks compare true positions, so what the model computes is unchanged. A bidirectional
stack needs no balancing and keeps the natural order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

CONTEXT_AXIS = "context"


def context_size() -> int:
  """The size of the `context` axis of the mesh being traced under (1 without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or CONTEXT_AXIS not in mesh.axis_names:
    return 1
  return int(mesh.shape[CONTEXT_AXIS])


def check_context(length: int, shards: int, what: str = "sequence", zigzag: bool = False):
  """A clear error when `length` tokens cannot split over `shards` devices (2 * shards chunks
  when zig-zag balanced)."""
  parts = 2 * shards if zigzag else shards
  if length % parts:
    raise ValueError(
        f"{what} length {length} does not split over mesh.context={shards}"
        + (f" in 2 x {shards} zig-zag chunks" if zigzag else "")
        + f": make it a multiple of {parts} (--config.seq_len) or change --config.mesh.context"
    )


def zigzag_order(length: int, shards: int) -> np.ndarray:
  """Token indices in zig-zag order: chunks 0, 2N-1, 1, 2N-2, ..., N-1, N of `length`/2N
  tokens, so that device i of N (holding the i-th N-th of the result) has chunks i and
  2N-1-i."""
  check_context(length, shards, zigzag=True)
  chunk = length // (2 * shards)
  chunks = [c for i in range(shards) for c in (i, 2 * shards - 1 - i)]
  return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in chunks])


def to_zigzag(x, shards: int, axis: int = 1):
  """x with its `axis` (tokens) in zig-zag order; None stays None."""
  if x is None or shards == 1:
    return x
  return jnp.take(x, zigzag_order(x.shape[axis], shards), axis=axis)


def from_zigzag(x, shards: int, axis: int = 1):
  """Inverse of `to_zigzag`."""
  if x is None or shards == 1:
    return x
  return jnp.take(x, np.argsort(zigzag_order(x.shape[axis], shards)), axis=axis)


def attend_over_context(attend_fn, q, k, v, mask, positions, causal: bool, logit_max_fn=None):
  """attend_fn(q, k, v, mask, causal) with the tokens split over `context`: q [B, T, H, K] stays
  split, k and v [B, S, G, K] and the mask's key fields are all-gathered over `context`.

  `mask` is an AttentionMask (modules/masks.py) or None; `positions` [B, T] are the queries'
  true positions (self-attention: the keys' too), which a causal mask compares, so a
  zig-zag-permuted sequence is masked by where its tokens really are. `logit_max_fn(q, k, mask,
  causal)`, when given, is also computed over the gathered keys and maxed over `context`:
  returns (out, logit max) then."""
  from transformers_jax.modules.masks import AttentionMask

  mask = mask if mask is not None else AttentionMask()
  if causal:
    if positions is None:
      raise ValueError("causal attention over mesh.context needs the tokens' positions")
    mask = mask.replace(q_positions=positions, kv_positions=positions)
  self_segments = mask.q_segments is not None and mask.kv_segments is None
  if self_segments:  # self-attention: the keys' segments are the queries'
    mask = mask.replace(kv_segments=mask.q_segments)
  split = P(None, CONTEXT_AXIS)
  mask_specs = jax.tree_util.tree_map(lambda _: split, mask)

  def local(q, k, v, mask):
    gather = lambda x: jax.lax.all_gather(x, CONTEXT_AXIS, axis=1, tiled=True)  # noqa: E731
    k, v = gather(k), gather(v)
    mask = mask.replace(
        kv_segments=None if mask.kv_segments is None else gather(mask.kv_segments),
        kv_valid=None if mask.kv_valid is None else gather(mask.kv_valid),
        kv_positions=None if mask.kv_positions is None else gather(mask.kv_positions),
    )
    if not any(x is not None for x in jax.tree_util.tree_leaves(mask)):
      mask = None
    out = attend_fn(q, k, v, mask, causal)
    if logit_max_fn is None:
      return out
    return out, jax.lax.pmax(logit_max_fn(q, k, mask, causal), CONTEXT_AXIS)

  out_specs = split if logit_max_fn is None else (split, P())
  return jax.shard_map(
      local,
      in_specs=(split, split, split, mask_specs),
      out_specs=out_specs,
      axis_names={CONTEXT_AXIS},
  )(q, k, v, mask)
