"""Dropless mixture of experts: tokens sorted by expert, grouped matmuls, expert parallelism.

Every device routes its own tokens. The k choices of its N tokens become N*k rows, sorted by
expert (first choices before second ones, so that a capacity, when set, drops the later
choices first); each expert's rows are then one contiguous group, and the expert matmuls are
grouped matmuls over those groups: on TPU the megablox Pallas kernel (`gmm`; XLA's own
`ragged_dot` there multiplies the weight gradient by every group), on GPU `jax.lax.ragged_dot`.
On the CPU, whose `ragged_dot` multiplies every row by every expert, the groups are padded
to blocks of rows instead and each block multiplied by its expert's weights: the same result at
the cost of the rows actually routed. With `moe_dropless` no choice is dropped; otherwise each
expert takes at most ceil(capacity_factor * N * k / E) rows of the device's N tokens.

Expert parallelism: with the `experts` of the weights split over the `expert` mesh axis (which
also splits the batch), each device holds E/n experts. Its sorted rows are cut into n buffers,
one per device, holding the rows of that device's experts; an all-to-all over `expert` swaps
them, each device runs its experts on the received blocks one source at a time, and a second
all-to-all brings the results home. A buffer holds every row a device may send to one device
(dropless: N * min(k, E/n), as a token's k choices are k different experts), or the rows a
capacity lets through. The layer runs inside a `shard_map` over the whole mesh: the expert
matrices arrive split along d_model over the FSDP axes, as stored, and are cast to the compute
dtype and gathered inside (modules/moe_weights.py: on TPU without expert parallelism, one
expert at a time); they are split over `expert` and `tensor`, and the partial results of a
split hidden dimension are summed over `tensor`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from transformers_jax.modules.moe_weights import combine, gather_experts, streamed_expert_ffn

# Largest block of rows the CPU grouped matmul pads each expert's group to.
MAX_BLOCK_ROWS = 128
# Most bytes of hidden activations (h, h1) one chunk of a device's sorted rows holds (chunked_ffn;
# Mixtral 8x7B at 36 x 4,096 tokens per chip: 294,912 rows x 14,336 x 2 x 2 bytes = 15.8 GiB).
CHUNK_HIDDEN_BYTES = 2 * 2**30


def expert_capacity(c, tokens: int) -> int | None:
  """Rows each expert takes from `tokens` tokens; None when dropless. At most `tokens`: an
  expert meets each token at most once, whatever capacity_factor (1e9 for "never drop") says."""
  if c.moe_dropless:
    return None
  return min(tokens, max(1, math.ceil(c.capacity_factor * tokens * c.top_k / c.num_experts)))


def sort_choices(top_i, num_experts: int, capacity: int | None):
  """Routing choices [N, k] -> (order [N*k], group_sizes [E], kept [N*k]).

  Choices are numbered rank-major (choice r of token t is row r*N + t); `order` lists the rows
  sorted by expert, with the choices an expert has no room for (position >= capacity, counted
  in row order) at the end; `group_sizes` counts each expert's kept rows; `kept` says, per row
  in the original numbering, whether it was kept."""
  n, k = top_i.shape
  ids = top_i.T.reshape(n * k)
  if capacity is None:
    kept, key = jnp.ones(ids.shape, bool), ids
  else:
    ranks = jnp.cumsum(jax.nn.one_hot(ids, num_experts, dtype=jnp.int32), axis=0)
    position = jnp.take_along_axis(ranks, ids[:, None], axis=1)[:, 0] - 1
    kept = position < capacity
    key = jnp.where(kept, ids, num_experts)
  order = jnp.argsort(key, stable=True)
  group_sizes = jnp.bincount(key, length=num_experts + 1)[:num_experts].astype(jnp.int32)
  return order, group_sizes, kept


def _group_of_rows(group_sizes, rows: int):
  """The group of each of `rows` sorted rows ([rows]; len(group_sizes) past the last group)."""
  return jnp.searchsorted(
      jnp.cumsum(group_sizes), jnp.arange(rows), side="right", method="compare_all"
  )


def block_rows(rows: int, groups: int) -> int:
  """Rows per block of the CPU grouped matmul: about half a group's rows, 8 to 128."""
  target = max(1, rows // (2 * groups))
  return max(8, min(MAX_BLOCK_ROWS, 1 << (target.bit_length() - 1)))


def grouped_ffn_blocked(xs, group_sizes, weights, act, gated: bool, block: int | None = None):
  """The expert FFN of sorted rows xs [M, D] (group g: rows of expert g, rows past the groups
  zero), each group padded to whole blocks of `block` rows, each block multiplied by its own
  expert's weights (gathered per block): plain batched matmuls at the cost of the routed rows."""
  (m, d), e = xs.shape, group_sizes.shape[0]
  b = block or block_rows(m, e)
  blocks = (m + e * (b - 1)) // b
  padded = -(-group_sizes // b) * b
  padded_start = jnp.cumsum(padded) - padded
  start = jnp.cumsum(group_sizes) - group_sizes
  slots = jnp.arange(blocks * b)
  slot_group = jnp.minimum(
      jnp.searchsorted(jnp.cumsum(padded), slots, side="right", method="compare_all"), e - 1
  )
  offset = slots - padded_start[slot_group]
  slot_valid = offset < group_sizes[slot_group]
  source = jnp.clip(start[slot_group] + offset, 0, m - 1)
  xp = jnp.where(slot_valid[:, None], xs[source], 0).reshape(blocks, b, d)
  block_group = slot_group.reshape(blocks, b)[:, 0]

  def mm(x, name):
    out = jnp.einsum("nbd,ndf->nbf", x, weights[name][block_group])
    bias = weights.get("b" + name[1:]) if name != "wo" else None
    return out if bias is None else out + bias[block_group][:, None]

  h = mm(xp, "wi")
  h = combine(act, h, mm(xp, "wi_1")) if gated else act(h)
  out = mm(h, "wo").reshape(blocks * b, -1)
  row_group = _group_of_rows(group_sizes, m)
  valid = row_group < e
  row_group = jnp.minimum(row_group, e - 1)
  dest = jnp.clip(padded_start[row_group] + jnp.arange(m) - start[row_group], 0, blocks * b - 1)
  return jnp.where(valid[:, None], out[dest], 0)


def tpu_grouped_matmul(x, w, sizes, interpret: bool = False):
  """x [M, K] (M a multiple of 128) times w [G, K, N] per group of rows, with the megablox
  Pallas kernel: tiles of rows meet only their own group's weights, forward and backward (XLA's
  ragged_dot computes the weight gradient against every group). `sizes` may count more groups
  than w has: the rows of those are neither multiplied nor written (zero). `interpret`: Pallas
  interpret mode, to test the kernel off a TPU."""
  from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

  tiling = (128, min(128, x.shape[1]), min(128, w.shape[2]))
  offset = jnp.int32(0) if sizes.shape[0] > w.shape[0] else None
  return megablox.gmm(
      x,
      w,
      sizes,
      preferred_element_type=x.dtype,
      tiling=tiling,
      group_offset=offset,
      interpret=interpret,
  )


def grouped_ffn_ragged_dot(
    xs, group_sizes, weights, act, gated: bool, tpu: bool = False, interpret: bool = False
):
  """The expert FFN of sorted rows xs [M, D] with `jax.lax.ragged_dot`, rows past the groups
  given to the last group, then zeroed; `tpu`: with the megablox kernel, on rows padded to a
  multiple of 128, the rows past the groups forming a group of their own that the kernel skips
  (a dropless expert-parallel buffer is mostly such rows); `interpret`: its interpret mode."""
  m = xs.shape[0]
  e = group_sizes.shape[0]
  if tpu and m % 128:
    pad = -m % 128
    out = grouped_ffn_ragged_dot(
        jnp.pad(xs, ((0, pad), (0, 0))), group_sizes, weights, act, gated, tpu, interpret
    )
    return out[:m]
  total = jnp.sum(group_sizes)
  if tpu:
    sizes = jnp.concatenate([group_sizes, (m - total)[None]]).astype(jnp.int32)
    matmul = functools.partial(tpu_grouped_matmul, interpret=interpret)
  else:
    sizes = group_sizes.at[-1].add(m - total)
    matmul = jax.lax.ragged_dot
  row_group = jnp.minimum(_group_of_rows(group_sizes, m), e - 1)

  def mm(x, name):
    out = matmul(x, weights[name], sizes)
    bias = weights.get("b" + name[1:]) if name != "wo" else None
    return out if bias is None else out + bias[row_group]

  h = mm(xs, "wi")
  h = combine(act, h, mm(xs, "wi_1")) if gated else act(h)
  out = mm(h, "wo")
  return jnp.where((jnp.arange(m) < total)[:, None], out, 0)


def add_output_bias(out, group_sizes, bias):
  """out [M, D] of sorted rows plus each row's expert's output bias (rows past the groups: 0)."""
  e = group_sizes.shape[0]
  row_group = _group_of_rows(group_sizes, out.shape[0])
  return out + jnp.where((row_group < e)[:, None], bias[jnp.minimum(row_group, e - 1)], 0)


def grouped_ffn(xs, group_sizes, weights, act, gated: bool, platform: str):
  """The expert FFN of rows sorted by expert, without the output bias (`bo`, which the caller
  adds once the partial sums of a split hidden dimension are summed): the megablox kernel on
  TPU, ragged_dot on GPU, blocks elsewhere."""
  if platform in ("tpu", "gpu", "cuda", "rocm"):
    return grouped_ffn_ragged_dot(xs, group_sizes, weights, act, gated, tpu=platform == "tpu")
  return grouped_ffn_blocked(xs, group_sizes, weights, act, gated)


def row_chunks(c, rows: int, dtype, limit: int = CHUNK_HIDDEN_BYTES) -> int:
  """Chunks that keep a device's `rows` sorted rows' hidden activations under `limit` bytes."""
  per_row = c.ff_width * (2 if c.gated else 1) * jnp.dtype(dtype).itemsize
  return max(1, -(-rows * per_row // limit))


def chunked_ffn(ffn, xs, group_sizes, weights, chunks: int):
  """ffn(rows, group_sizes, weights) over sorted rows xs [M, D] in `chunks` consecutive chunks
  of a multiple of 128 rows, each with its experts' group sizes within the chunk: a scan whose
  body is rematerialised, so only one chunk's hidden activations exist at a time, forward and
  backward (at the cost of the chunks' forward once more in the backward pass)."""
  if chunks == 1:
    return ffn(xs, group_sizes, weights)
  m = xs.shape[0]
  per_chunk = -(-m // chunks // 128) * 128
  chunks = -(-m // per_chunk)
  padded = jnp.pad(xs, ((0, per_chunk * chunks - m), (0, 0)))
  end = jnp.cumsum(group_sizes)  # each expert's rows: [end - size, end)

  @jax.checkpoint
  def body(weights, chunk):
    first = chunk * per_chunk
    sizes = jnp.minimum(end, first + per_chunk) - jnp.maximum(end - group_sizes, first)
    rows = jax.lax.dynamic_slice_in_dim(padded, first, per_chunk)
    return ffn(rows, jnp.maximum(sizes, 0).astype(group_sizes.dtype), weights)

  _, out = jax.lax.scan(lambda _, first: (None, body(weights, first)), None, jnp.arange(chunks))
  return out.reshape(chunks * per_chunk, -1)[:m]


def _inverse(order):
  return jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))


def exchange_ffn(xs, group_sizes, weights, ffn, axis: str, shards: int, capacity, tokens: int):
  """Rows sorted by (global) expert xs [M, D] on each device of `axis` (the k choices of
  `tokens` tokens) -> their expert FFN outputs, the experts being split over `axis` in `shards`
  contiguous slices: rows travel to the devices of their experts in one all-to-all, each source's
  block is run in turn (a rematerialised scan: one block's hidden states live at a time), and
  the results come back in another all-to-all. A token's k choices are k different experts, so
  at most min(k, experts per device) of them go to one device: without a capacity a buffer
  holds tokens * min(k, E / shards) rows."""
  m, _ = xs.shape
  per_shard = group_sizes.shape[0] // shards
  sizes = group_sizes.reshape(shards, per_shard)
  send_sizes = jnp.sum(sizes, axis=1)
  send_start = jnp.cumsum(send_sizes) - send_sizes
  rows = min(m, tokens * min(m // tokens, per_shard))
  rows = rows if capacity is None else min(rows, capacity * per_shard)
  index = send_start[:, None] + jnp.arange(rows)
  filled = jnp.arange(rows) < send_sizes[:, None]
  send = jnp.where(filled[..., None], xs[jnp.clip(index, 0, m - 1)], 0)  # [shards, rows, D]
  recv = jax.lax.all_to_all(send, axis, 0, 0, tiled=True)
  recv_sizes = jax.lax.all_to_all(sizes, axis, 0, 0, tiled=True)  # [source, local expert]

  # each source's block is sorted by local expert (its slice of the sender's sorted rows)
  def run_block(carry, block):
    return carry, ffn(block[0], block[1].astype(jnp.int32), weights)

  _, out = jax.lax.scan(jax.checkpoint(run_block), None, (recv, recv_sizes))
  back = jax.lax.all_to_all(out, axis, 0, 0, tiled=True)  # [destination, rows, D]
  row_group = _group_of_rows(group_sizes, m)
  valid = row_group < group_sizes.shape[0]
  dest = jnp.minimum(row_group, group_sizes.shape[0] - 1) // per_shard
  slot = jnp.clip(jnp.arange(m) - send_start[dest], 0, rows - 1)
  return jnp.where(valid[:, None], back[dest, slot], 0)


def local_moe(
    x,
    top_p,
    top_i,
    weights,
    *,
    c,
    act,
    platform,
    dtype,
    capacity_of,
    expert_axis,
    shards,
    tensor_axes,
    token_axes,
    gather_axes,
):
  """One device's MoE: x [b, t, D], its routing (top_p, top_i [b, t, k]) and its share of the
  expert weights (matrices split over `gather_axes` along d_model) -> (output [b, t, D], rows
  kept per expert [E] summed over the token axes)."""
  b, t, d = x.shape
  n, k = b * t, top_i.shape[-1]
  capacity = capacity_of(n)
  order, group_sizes, kept = sort_choices(top_i.reshape(n, k), c.num_experts, capacity)
  xs = x.reshape(n, d)[order % n]
  if c.moe_scale_input:  # Llama 4: each row times its weight on the way in, none on the way out
    weight = top_p.reshape(n, k).T.reshape(-1, 1)[order]  # (choices are numbered rank-major)
    xs, top_p = xs * weight.astype(xs.dtype), jnp.ones_like(top_p)
  # without expert parallelism, on TPU, an FSDP-split layer's experts are gathered one by one
  stream = platform == "tpu" and shards == 1 and bool(gather_axes)

  def ffn(rows, sizes, w):
    if stream:
      pad = -rows.shape[0] % 128
      out = streamed_expert_ffn(
          jnp.pad(rows, ((0, pad), (0, 0))), sizes, w, act, c.gated, dtype, gather_axes
      )[: rows.shape[0]]
    else:
      out = grouped_ffn(rows, sizes, w, act, c.gated, platform)
    out = jax.lax.psum(out, tensor_axes) if tensor_axes else out
    return add_output_bias(out, sizes, w["bo"].astype(dtype)) if "bo" in w else out

  if shards > 1:
    whole = gather_experts(weights, dtype, gather_axes)
    ys = exchange_ffn(xs, group_sizes, whole, ffn, expert_axis, shards, capacity, n)
  else:
    whole = weights if stream else gather_experts(weights, dtype, gather_axes)
    ys = chunked_ffn(ffn, xs, group_sizes, whole, row_chunks(c, xs.shape[0], dtype))
  y = ys[_inverse(order)].reshape(k, n, d)
  gate = (top_p.reshape(n, k).T * kept.reshape(k, n)).astype(y.dtype)
  out = jnp.einsum("knd,kn->nd", y, gate).reshape(b, t, d)
  kept_rows = group_sizes.astype(jnp.float32)
  if token_axes:
    kept_rows = jax.lax.psum(kept_rows, token_axes)
  return out, kept_rows


def _axes(entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def ragged_moe(c, x, top_p, top_i, weights, act, platform: str, dtype):
  """x [B, T, D] and its routing -> (output [B, T, D], rows kept per expert [E], all tokens).

  Without a mesh it runs as it is; under one, inside a shard_map over every mesh axis (see the
  module docstring), with `weights` a dict of wi, wi_1, wo ([E, ...]) and biases bi, bi_1, bo
  ([E, width]) present only when used, in the parameter dtype: they are cast to the compute
  `dtype` before they are gathered."""
  capacity_of = lambda n: expert_capacity(c, n)  # noqa: E731
  mesh = jax.sharding.get_abstract_mesh()
  common = dict(c=c, act=act, platform=platform, dtype=dtype, capacity_of=capacity_of)
  if mesh.empty:
    return local_moe(
        x,
        top_p,
        top_i,
        weights,
        expert_axis=None,
        shards=1,
        tensor_axes=(),
        token_axes=(),
        gather_axes=(),
        **common,
    )
  sizes = dict(mesh.shape)
  token_spec = nn.logical_to_mesh_axes(("act_batch", "act_length", None))
  token_spec = P(*[_fit(a, n, sizes) for a, n in zip(token_spec, x.shape)])
  token_axes = tuple(a for entry in token_spec for a in _axes(entry))
  expert_axes = _axes(nn.logical_to_mesh_axes(("experts",))[0])
  shards = math.prod(sizes[a] for a in expert_axes)
  # experts travel only over an axis that also splits the tokens; otherwise they are gathered
  if len(expert_axes) != 1 or expert_axes[0] not in token_axes or c.num_experts % shards:
    expert_axes, shards = (), 1
  expert_axis = expert_axes[0] if expert_axes else None
  tensor_axes = tuple(a for a in _axes(nn.logical_to_mesh_axes(("mlp",))[0]) if a not in token_axes)
  if tensor_axes and c.ff_width % math.prod(sizes[a] for a in tensor_axes):
    tensor_axes = ()
  ff = tensor_axes[0] if len(tensor_axes) == 1 else (tensor_axes or None)
  # the matrices enter split along d_model as FSDP stores them and are gathered inside
  taken = {expert_axis, *tensor_axes}
  gather_axes = tuple(
      a for a in _axes(nn.logical_to_mesh_axes(("embed",))[0]) if sizes[a] > 1 and a not in taken
  )
  if c.d_model % math.prod(sizes[a] for a in gather_axes):
    gather_axes = ()
  dm = gather_axes[0] if len(gather_axes) == 1 else (gather_axes or None)
  specs = {
      "wi": P(expert_axis, dm, ff),
      "wi_1": P(expert_axis, dm, ff),
      "wo": P(expert_axis, ff, dm),
      "bi": P(expert_axis, ff),
      "bi_1": P(expert_axis, ff),
      "bo": P(expert_axis, None),
  }
  body = lambda x, p, i, w: local_moe(  # noqa: E731
      x,
      p,
      i,
      w,
      expert_axis=expert_axis,
      shards=shards,
      tensor_axes=tensor_axes,
      token_axes=token_axes,
      gather_axes=gather_axes,
      **common,
  )
  return jax.shard_map(
      body,
      in_specs=(token_spec, token_spec, token_spec, {k: specs[k] for k in weights}),
      out_specs=(token_spec, P()),
      check_vma=False,  # the megablox kernel's outputs carry no per-axis variance annotations
  )(x, top_p, top_i, weights)


def _fit(entry, size: int, sizes) -> object:
  """A spec entry kept only when its axes divide the dimension evenly."""
  axes = _axes(entry)
  return entry if axes and size % math.prod(sizes[a] for a in axes) == 0 else None
