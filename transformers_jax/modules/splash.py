"""TPU splash attention (jax.experimental.pallas.ops.tpu.splash_attention), sharded by shard_map.

The Pallas kernel works on one batch element's [heads, length, head_dim] arrays; it is vmapped
over the batch and, when a mesh is in context (the train step is traced under
`jax.sharding.use_abstract_mesh`), run by `jax.shard_map` on each device's part of the batch and
of the heads, as the logical rules `act_batch` and `act_heads` place them. Grouped key/value
heads go to the kernel as they are (its MHA form takes G kv heads for H query heads; MQA, one kv
head, its MQA form), never repeated. The mask is static (CausalMask or FullMask, so whole blocks
above the diagonal are skipped by the kernel); packing and key padding go in as segment ids:
a padding key gets an id no query has. The kernel applies no 1/sqrt(K) scale: q is scaled
first. Lengths are padded to the block sizes, which are multiples of 128 (the TPU lane width).
Off a TPU the kernel runs in Pallas interpret mode (slow: tests only). Causal order by
positions (a permuted sequence) is not a static mask: `attend` sends such masks to flash.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from transformers_jax.modules.masks import AttentionMask, is_causal

LANES = 128  # splash block sizes are multiples of the TPU lane width
NO_SEGMENT = jnp.iinfo(jnp.int32).min  # the segment id of a padding key: no query has it


def target_platform() -> str:
  """The platform the computation is compiled for: the context mesh's devices (a TPU topology
  compiled ahead of time from a CPU host is "tpu"), else the default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.abstract_device is not None:
    return mesh.abstract_device.platform
  return jax.default_backend()


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _mesh_axes(logical: str, mesh) -> tuple[str, ...]:
  """The mesh axes (of size > 1) the logical rules in context give `logical`."""
  try:
    (axes,) = nn.logical_to_mesh_axes((logical,))
  except (ValueError, KeyError):
    return ()
  if axes is None:
    return ()
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return tuple(a for a in axes if a in mesh.axis_names and mesh.shape[a] > 1)


def _segment_ids(mask, B: int, T: int, S: int, Tp: int, Sp: int):
  """(q ids [B, Tp], kv ids [B, Sp]) int32, or None when nothing masks beyond the static mask."""
  q_ids = kv_ids = valid = None
  if isinstance(mask, AttentionMask):
    if mask.q_segments is not None:
      q_ids = jnp.broadcast_to(mask.q_segments.astype(jnp.int32), (B, T))
      kv_ids = jnp.broadcast_to(mask.key_segments.astype(jnp.int32), (B, S))
    if mask.kv_valid is not None:
      valid = jnp.broadcast_to(mask.kv_valid.astype(bool), (B, S))
  elif mask is not None:
    raise TypeError("splash attention takes an AttentionMask (modules/masks.py), not a dense mask")
  if q_ids is None and valid is None and Sp == S:
    return None
  if q_ids is None:
    q_ids, kv_ids = jnp.zeros((B, T), jnp.int32), jnp.zeros((B, S), jnp.int32)
  if valid is not None:
    kv_ids = jnp.where(valid, kv_ids, NO_SEGMENT)
  # padded queries share the first key's segment, so that no row (even a dropped one) is empty
  q_ids = jnp.concatenate([q_ids, jnp.broadcast_to(kv_ids[:, :1], (B, Tp - T))], axis=1)
  kv_ids = jnp.pad(kv_ids, ((0, 0), (0, Sp - S)), constant_values=NO_SEGMENT)
  return q_ids, kv_ids


def _splash_module():
  """jax's splash attention kernels, imported on first use: importing Pallas's TPU kernels
  costs every process that never attends by splash (most, and every CPU run) about half a
  second of start-up."""
  from jax.experimental.pallas.ops.tpu import splash_attention

  return splash_attention


def _kernel(heads: int, kv_heads: int, Tp: int, Sp: int, causal: bool, bq: int, bk: int, interpret):
  sa = _splash_module()
  shape = (Tp, Sp)
  mask = sa.MultiHeadMask([sa.CausalMask(shape) if causal else sa.FullMask(shape)] * heads)
  blocks = sa.BlockSizes(
      block_q=bq,
      block_kv=bk,
      block_kv_compute=bk,
      block_q_dkv=bq,
      block_kv_dkv=bk,
      block_kv_dkv_compute=bk,
      block_q_dq=bq,
      block_kv_dq=bk,
  )
  make = sa.make_splash_mqa if kv_heads == 1 else sa.make_splash_mha
  return make(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(
    q, k, v, mask=None, causal: bool = False, block_q=512, block_kv=512, sinks=None
):
  """softmax(q k^T / sqrt(K) + mask) v by the splash kernel; q [B, T, H, K], k v [B, S, G, K].

  `mask`: an AttentionMask without positions (its pattern causal or not), or None; `causal`,
  for a mask of None: key j > query i masked. A prefix, window or chunks go to flash. `sinks`:
  [H] attention sinks (modules/sinks.py), which the kernel starts each row's softmax from."""
  if isinstance(mask, AttentionMask) and (mask.has_positions or mask.needs_positions):
    raise ValueError(
        "splash attention masks by index only: send masks with positions, a window, a prefix or "
        "chunks to flash"
    )
  causal = is_causal(mask, causal)
  B, T, H, K = q.shape
  S, G = k.shape[1], k.shape[2]
  interpret = target_platform() != "tpu"
  bq = min(_round_up(block_q, LANES), _round_up(T, LANES))
  bk = min(_round_up(block_kv, LANES), _round_up(S, LANES))
  Tp, Sp = _round_up(T, bq), _round_up(S, bk)
  ids = _segment_ids(mask, B, T, S, Tp, Sp)
  scale = 1.0 / math.sqrt(K)
  qh = jnp.pad(
      (q * scale).astype(q.dtype).transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, Tp - T), (0, 0))
  )
  kh, vh = (jnp.pad(x.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, Sp - S), (0, 0))) for x in (k, v))

  def local(qh, kh, vh, ids, sinks):
    """On one device's [b, h, Tp, K] queries and [b, g, Sp, K] keys/values (and [b, Tp] /
    [b, Sp] segment ids, [h] sinks, or None)."""
    heads, kv_heads = qh.shape[1], kh.shape[1]
    kernel = _kernel(heads, kv_heads, Tp, Sp, causal, bq, bk, interpret)
    if kv_heads == 1:
      kh, vh = kh[:, 0], vh[:, 0]
    extra = {} if sinks is None else {"sinks": sinks}
    if ids is None:
      return jax.vmap(lambda q, k, v: kernel(q, k, v, **extra))(qh, kh, vh)
    segments = _splash_module().SegmentIds(q=ids[0], kv=ids[1])
    return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=s, **extra))(
        qh, kh, vh, segments
    )

  sinks = None if sinks is None else sinks.astype(jnp.float32)
  args = (qh, kh, vh, ids, sinks)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    out = local(*args)
  else:
    batch = _mesh_axes("act_batch", mesh)
    if B % math.prod(mesh.shape[a] for a in batch):
      batch = ()
    heads = _mesh_axes("act_heads", mesh)
    n = math.prod(mesh.shape[a] for a in heads)
    if H % n or (G > 1 and G % n):  # kv heads that do not split with the query heads: whole
      heads = ()
    b, h = batch or None, heads or None
    q_spec = P(b, h, None, None)
    kv_spec = P(b, h if G > 1 else None, None, None)
    specs = (q_spec, kv_spec, kv_spec, (P(b, None), P(b, None)), P(h))
    specs = tuple(None if a is None else spec for a, spec in zip(args, specs))
    out = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=q_spec, check_vma=False)(*args)
  return out[:, :, :T].transpose(0, 2, 1, 3)
