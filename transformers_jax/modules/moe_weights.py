"""The expert weights of a ragged MoE layer inside its shard_map, where they arrive split over
the FSDP axes along d_model: gathered whole, or on TPU one expert at a time.

Under FSDP every layer's weights are gathered before use. For an MoE layer that is all its
experts at once (Mixtral 8x7B: 1.4B parameters, 2.6 GiB in bf16 per chip), and the backward pass
holds them again next to their gradients. `streamed_expert_ffn` instead scans over the experts:
each step casts one expert's matrices to the compute dtype, gathers them (the all-gather moves
compute-dtype bytes) and multiplies that expert's rows with the megablox kernel; the backward
pass scans the experts again, gathers each one's matrices anew and reduce-scatters its weight
gradients (in the compute dtype) within the step: one expert's weights and weight gradients
are live at a time.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp

from transformers_jax.modules.glu import combine  # (a gated act's own combination, gpt-oss's)

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
  (`interpret`: the kernel in Pallas interpret mode, to test it off a TPU).

  The gradient is written out (a custom VJP) rather than taken through a rematerialised scan,
  which would run every expert's forward matmuls once more: the forward pass keeps the hidden
  pre-activations of all rows ([M, width], each row written by its own expert), and the
  backward pass scans the experts again, gathering each one's matrices, and reduce-scatters
  each expert's weight gradients (in `dtype`) over `axes` within its step."""
  # the module (the package's `gmm` is the differentiable wrapper): its kernels without VJPs
  kernels = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

  m = xs.shape[0]
  row_expert = jnp.searchsorted(
      jnp.cumsum(group_sizes), jnp.arange(m), side="right", method="compare_all"
  )
  matrices = {k: v for k, v in weights.items() if k in EMBED_AXIS}
  biases = {k: weights[k].astype(dtype) for k in ("bi", "bi_1") if k in weights}

  def experts():  # made where used: the backward pass is traced apart from the forward
    return jnp.arange(group_sizes.shape[0], dtype=jnp.int32)

  def gathered(mats, e):  # expert e's matrices [1, ...], cast and gathered
    return gather_experts(
        {k: jax.lax.dynamic_slice_in_dim(v, e, 1, axis=0) for k, v in mats.items()}, dtype, axes
    )

  def mm(x, w, sizes, e, transpose=False):
    k, n = (w.shape[2], w.shape[1]) if transpose else w.shape[1:]
    tiling = (128, min(128, k), min(128, n))
    return kernels.gmm(x, w, sizes, dtype, tiling, e, transpose_rhs=transpose, interpret=interpret)

  def tmm(x, g, sizes, e):  # x [M, K], g [M, N] -> [1, K, N], over expert e's rows
    tiling = (128, min(128, x.shape[1]), min(128, g.shape[1]))
    return kernels.tgmm(x.T, g, sizes, dtype, tiling, e, 1, interpret=interpret)

  def plus_bias(y, bias, e, mine):
    return y if bias is None else y + jnp.where(mine, bias[e], 0)

  def hidden(h, h1):
    return combine(act, h, h1) if gated else act(h)

  def forward(xs, mats, biases, sizes, row_expert):
    def step(carry, e):
      h, h1, out = carry
      w, mine = gathered(mats, e), (row_expert == e)[:, None]
      he = plus_bias(mm(xs, w["wi"], sizes, e), biases.get("bi"), e, mine)
      h1e = plus_bias(mm(xs, w["wi_1"], sizes, e), biases.get("bi_1"), e, mine) if gated else h1
      a = jnp.where(mine, hidden(he, h1e), 0)
      return (h + he, h1 + h1e if gated else h1, out + mm(a, w["wo"], sizes, e)), None

    width = matrices["wi"].shape[2]
    zeros = jnp.zeros((m, width), dtype)
    (h, h1, out), _ = jax.lax.scan(step, (zeros, zeros, jnp.zeros(xs.shape, dtype)), experts())
    return out, (xs, h, h1, mats, sizes, row_expert)

  def backward(res, g):
    xs, h, h1, mats, sizes, row_expert = res

    def step(dxs, e):
      w, mine = gathered(mats, e), (row_expert == e)[:, None]
      da = mm(g, w["wo"], sizes, e, transpose=True)  # zero outside expert e's rows
      # the activation and its derivative within the step (fused: no [M, width] residuals)
      a, hidden_vjp = jax.vjp(hidden, h, h1)
      dh, dh1 = hidden_vjp(da)
      grads = {"wo": tmm(jnp.where(mine, a, 0), g, sizes, e), "wi": tmm(xs, dh, sizes, e)}
      dxs = dxs + mm(dh, w["wi"], sizes, e, transpose=True)
      if gated:
        grads["wi_1"] = tmm(xs, dh1, sizes, e)
        dxs = dxs + mm(dh1, w["wi_1"], sizes, e, transpose=True)
      grads = {k: scatter(v, k, axes).astype(matrices[k].dtype)[0] for k, v in grads.items()}
      bias_grads = {"bi": jnp.sum(dh, axis=0), "bi_1": jnp.sum(dh1, axis=0)}
      return dxs, (grads, {k: bias_grads[k] for k in biases})

    dxs, (dmats, dbiases) = jax.lax.scan(step, jnp.zeros_like(xs), experts())
    return dxs, dmats, dbiases, None, None

  @jax.custom_vjp
  def run(xs, mats, biases, sizes, row_expert):
    return forward(xs, mats, biases, sizes, row_expert)[0]

  run.defvjp(forward, lambda res, g: backward(res, g.astype(dtype)))
  with jax.named_scope(STREAM_SCOPE):
    return run(xs.astype(dtype), matrices, biases, group_sizes, row_expert)


def scatter(grad, name: str, axes: tuple[str, ...]):
  """The transpose of `gather_experts` for matrix `name`: its gradient summed over `axes` and
  split along d_model."""
  if not axes:
    return grad
  return jax.lax.psum_scatter(grad, axes, scatter_dimension=EMBED_AXIS[name], tiled=True)
