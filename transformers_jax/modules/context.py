"""Context parallelism: the tokens of each sequence split over the `context` mesh axis.

Activations [B, T, ...] have their T axis (logical name `act_length`) split over `context`, so
every device holds T/N tokens of each of its sequences, and so do the feed-forward layers, the
norms and the head. Attention needs every key for every query: `attend_over_context` keeps the
queries on their device and all-gathers the keys and values (and the per-token mask fields) over
`context` inside a `shard_map`; their gradients come back as a reduce-scatter. Per device the
score blocks then cover T/N queries x T keys: an Nth of the whole. With
model.context_strategy=ring they are not gathered but passed from device to device in N steps
(modules/ring.py), so no device holds more than its own T/N keys and values at once.

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
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from transformers_jax.modules.masks import AttentionMask, is_causal
from transformers_jax.modules.ring import ring_attention
from transformers_jax.modules.splash import target_platform

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
  """Inverse of `to_zigzag`. Under a mesh whose `context` axis has `shards` devices, with x
  [B, T, ...] split over it, each device sends its two chunks to where they belong in natural
  order (two collective permutes of one chunk each; a gather would all-gather x)."""
  if x is None or shards == 1:
    return x
  if axis != 1 or context_size() != shards:
    return jnp.take(x, np.argsort(zigzag_order(x.shape[axis], shards)), axis=axis)
  check_context(x.shape[1], shards, zigzag=True)
  n = shards
  # Device k holds chunks k (first half) and 2n-1-k (second half); in natural order device j
  # holds chunks 2j and 2j+1. Every device sends one even chunk and one odd chunk:
  to_even = [(k, k // 2 if k % 2 == 0 else (2 * n - 1 - k) // 2) for k in range(n)]
  to_odd = [(k, (k - 1) // 2 if k % 2 else (2 * n - 2 - k) // 2) for k in range(n)]
  spec = _spec(("act_batch", "act_length") + (None,) * (x.ndim - 2), x.shape)

  def local(x):
    first, second = jnp.split(x, 2, axis=1)
    even_device = jax.lax.axis_index(CONTEXT_AXIS) % 2 == 0
    even = jnp.where(even_device, first, second)  # the chunk with an even index
    odd = jnp.where(even_device, second, first)
    even = jax.lax.ppermute(even, CONTEXT_AXIS, to_even)
    odd = jax.lax.ppermute(odd, CONTEXT_AXIS, to_odd)
    return jnp.concatenate([even, odd], axis=1)

  return jax.shard_map(local, in_specs=spec, out_specs=spec, check_vma=False)(x)


def attend_over_context(
    fn,
    q,
    kvs,
    mask,
    positions,
    causal: bool,
    reduce_max: bool = False,
    ring: tuple[int, int] | None = None,
    bias=None,
    softcap: float = 0.0,
    sinks=None,
):
  """fn(q, *kvs, mask, causal, bias, sinks) with the tokens split over `context`: q [B, T, H, K] stays
  split, the key-side arrays `kvs` ([B, S, ...]: keys, values) and the mask's key fields are
  all-gathered over `context` (their gradients reduce-scattered back).

  `mask` is an AttentionMask (modules/masks.py) or None; `positions` [B, T] are the queries'
  true positions (self-attention: the keys' too), which a causal mask then compares, so that a
  zig-zag-permuted sequence is masked by where its tokens really are. fn's result is split
  like q, or with `reduce_max` a scalar maxed over `context`. With `ring` (block sizes: queries,
  keys) the keys and values are not gathered but passed around the context axis
  (modules/ring.py, blockwise: fn is not used).
  A score `bias` (modules/positions.ScoreBias) is evaluated at the true positions, which the
  mask then carries whether or not the attention is causal; its weights split over heads as
  q does, and so do the attention `sinks` [H] (modules/sinks.py) where there are any."""
  if mask is not None and not isinstance(mask, AttentionMask):
    raise ValueError(
        "attention over mesh.context takes per-token masks (modules/masks.AttentionMask), not a "
        "dense [B, 1, T, S] one: build it with masks.token_mask"
    )
  mask = mask if mask is not None else AttentionMask(causal=bool(causal))
  causal = is_causal(mask, causal)
  if causal or bias is not None or mask.needs_positions:
    if positions is None:
      raise ValueError("attention over mesh.context needs the tokens' positions")
    mask = mask.replace(q_positions=positions, kv_positions=positions)
  if mask.q_segments is not None and mask.kv_segments is None:  # self-attention's segments
    mask = mask.replace(kv_segments=mask.q_segments)
  # Every mesh axis is manual inside: the blocks each device computes are its own batch rows,
  # heads and queries (a partitioner left with the batch and head axes gathers them instead).
  q_spec = _spec(("act_batch", "act_length", "act_heads", None), q.shape)
  kv_specs = tuple(_spec(("act_batch", "act_length", "act_heads", None), x.shape) for x in kvs)
  if any(s[2] != q_spec[2] for s in kv_specs):
    raise ValueError(
        f"mesh.context: {kvs[0].shape[2]} key/value heads do not split over the axes of the "
        f"{q.shape[2]} query heads ({q_spec[2]}): use kv_heads that divide by them, or "
        "--config.mesh.tensor=1"
    )
  token_spec = P(q_spec[0], CONTEXT_AXIS)
  shards = context_size()

  def local(q, kvs, mask, bias, sinks):
    # Tie the mask to this layer's queries: otherwise a scan over layers, seeing the positions
    # the same in every layer, hoists the mask of every block pair out of the loop (jax's
    # loop-invariant residuals), one [T/N x S] mask per head, which is more than the scores.
    q, mask = jax.lax.optimization_barrier((q, mask))
    if ring and not reduce_max:
      return ring_attention(q, *kvs, mask, causal, CONTEXT_AXIS, shards, bias, softcap, ring, sinks)
    gather = lambda x: jax.lax.all_gather(x, CONTEXT_AXIS, axis=1, tiled=True)  # noqa: E731
    kvs = tuple(gather(x) for x in kvs)
    mask = mask.replace(
        kv_segments=None if mask.kv_segments is None else gather(mask.kv_segments),
        kv_valid=None if mask.kv_valid is None else gather(mask.kv_valid),
        kv_positions=None if mask.kv_positions is None else gather(mask.kv_positions),
    )
    if not jax.tree_util.tree_leaves(mask):
      mask = None
    out = fn(q, *kvs, mask, causal, bias, sinks)
    if reduce_max:
      return jax.lax.pmax(out, tuple(jax.sharding.get_abstract_mesh().axis_names))
    return out

  return jax.shard_map(
      local,
      in_specs=(
          q_spec,
          kv_specs,
          # [B, T] fields split as the tokens; a prefix [B] as the batch; the window P()
          jax.tree_util.tree_map(
              lambda x: token_spec if x.ndim == 2 else P(*token_spec[: x.ndim]), mask
          ),
          jax.tree_util.tree_map(lambda w: P(*(None,) * (w.ndim - 1), q_spec[2]), bias),
          jax.tree_util.tree_map(lambda _: P(q_spec[2]), sinks),
      ),
      out_specs=P() if reduce_max else q_spec,
      check_vma=False,  # flash's loops and conds carry no per-axis variance annotations
  )(q, tuple(kvs), mask, bias, sinks)


def _spec(names, shape) -> P:
  """The PartitionSpec the active rules give logical `names`, with `context` on the tokens and
  dimensions the mapped axes do not divide (e.g. fewer kv heads than `tensor`) left whole."""
  mesh = jax.sharding.get_abstract_mesh()
  spec = nn.logical_to_mesh_axes(names)
  dims = []
  for i, (size, axes) in enumerate(zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)))):
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    axes = tuple(a for a in axes if a != CONTEXT_AXIS)
    if i == 1:
      axes = (CONTEXT_AXIS,)
    whole = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    dims.append((axes[0] if len(axes) == 1 else axes) if axes and size % whole == 0 else None)
  return P(*dims)


def split_attention(
    attend_fn, logit_max_fn, positions, strategy: str = "all_gather", blocks=(512, 512)
):
  """(attend, max_attention_logit) of modules/attention.py, run with the tokens split over
  `context` (`attend_over_context`); same signatures as the two functions. Splash attention
  (whose kernel runs under a shard_map of its own) is replaced by flash attention here, which
  also masks by true position, as the zig-zag order needs. `strategy` (model.context_strategy):
  "all_gather" gathers the keys and values, "ring" passes them around (modules/ring.py) in
  flash `blocks` of (queries, keys). The largest attention logit that evaluation sows is taken
  over gathered keys with either strategy: a held-out batch's pass holds every key per layer."""

  def attend(
      q, k, v, mask, causal, dropout_fn=None, impl="auto", *args, bias=None, softcap=0.0, sinks=None
  ):
    if dropout_fn is not None:
      raise ValueError(
          "attention dropout is not applied over mesh.context: set model.attention_dropout=0"
      )
    if impl == "splash" or (impl == "auto" and target_platform() == "tpu"):
      impl = "flash"

    def core(q, k, v, m, cz, b, s):
      return attend_fn(q, k, v, m, cz, None, impl, *args, bias=b, softcap=softcap, sinks=s)

    ring = tuple(blocks) if strategy == "ring" else None
    return attend_over_context(
        core, q, (k, v), mask, positions, causal, ring=ring, bias=bias, softcap=softcap, sinks=sinks
    )

  def logit_max(q, k, mask, causal, *args, bias=None, cap=0.0):
    def core(q, k, m, cz, b, _):
      return logit_max_fn(q, k, m, cz, *args, bias=b, cap=cap)

    return attend_over_context(core, q, (k,), mask, positions, causal, reduce_max=True, bias=bias)

  return attend, logit_max
