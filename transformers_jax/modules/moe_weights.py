"""The expert weights of a ragged MoE layer inside its shard_map, where they arrive split over
the FSDP axes along d_model: gathered whole, or on TPU one expert at a time.

Under FSDP every layer's weights are gathered before use. For an MoE layer that is all its
experts at once (Mixtral 8x7B: 1.4B parameters, 2.6 GiB in bf16 per chip), and the backward pass
holds them again next to their gradients. `streamed_expert_ffn` instead scans over the experts:
each step casts one expert's matrices to the compute dtype, gathers them (the all-gather moves
compute-dtype bytes) and multiplies that expert's rows with the megablox kernel. The step is
rematerialised, so the backward pass gathers each expert again and reduce-scatters its gradient
(in the compute dtype) before the next expert: one expert's weights and weight gradients are
live at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The axis of d_model in each [E, ...] expert matrix: the one FSDP splits.
EMBED_AXIS = {"wi": 1, "wi_1": 1, "wo": 2}
STREAM_SCOPE = "moe_expert_stream"


def gather_experts(weights, dtype, axes: tuple[str, ...]):
  """The expert matrices and biases cast to `dtype`, the matrices then gathered over the mesh
  `axes` (inside a shard_map; none: as they are) along d_model."""
  out = {}
  for name, w in weights.items():
    w = w.astype(dtype)
    if axes and name in EMBED_AXIS:
      w = jax.lax.all_gather(w, axes, axis=EMBED_AXIS[name], tiled=True)
    out[name] = w
  return out


def streamed_expert_ffn(
    xs, group_sizes, weights, act, gated: bool, dtype, axes: tuple[str, ...], interpret=False
):
  """TPU: the expert FFN (without the output bias) of rows sorted by expert, xs [M, D] with M a
  multiple of 128 (rows past the groups: zero), the E experts' matrices split over `axes` along
  d_model and biases [E, width] whole: a scan over the experts, one expert gathered per step
  (see the module docstring). The megablox kernel with `group_offset` computes and writes only
  the tiles of its expert's rows and zeroes the others, so each row is multiplied once
  (`interpret`: the kernel in Pallas interpret mode, to test it off a TPU)."""
  from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

  m = xs.shape[0]
  row_expert = jnp.searchsorted(
      jnp.cumsum(group_sizes), jnp.arange(m), side="right", method="compare_all"
  )
  matrices = {k: v for k, v in weights.items() if k in EMBED_AXIS}
  biases = {k: v.astype(dtype) for k, v in weights.items() if k not in EMBED_AXIS}

  def step(out, e):
    one = {k: jax.lax.dynamic_slice_in_dim(v, e, 1, axis=0) for k, v in matrices.items()}
    w = gather_experts(one, dtype, axes)
    mine = (row_expert == e)[:, None]

    def mm(x, name):
      tiling = (128, min(128, x.shape[1]), min(128, w[name].shape[2]))
      y = megablox.gmm(
          x,
          w[name],
          group_sizes,
          preferred_element_type=dtype,
          tiling=tiling,
          group_offset=e,
          interpret=interpret,
      )
      bias = biases.get("b" + name[1:]) if name != "wo" else None
      return y if bias is None else y + jnp.where(mine, bias[e], 0)

    h = mm(xs, "wi")
    h = act(h) * mm(xs, "wi_1") if gated else act(h)
    return out + jnp.where(mine, mm(h, "wo"), 0), None

  experts = jnp.arange(group_sizes.shape[0], dtype=jnp.int32)
  with jax.named_scope(STREAM_SCOPE):
    out, _ = jax.lax.scan(jax.checkpoint(step), jnp.zeros(xs.shape, dtype), experts)
  return out
