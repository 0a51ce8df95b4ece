"""Small helpers shared by the modules: dtypes, initialisers with logical axis names, activations."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformers_jax.config import ACTIVATIONS


def dtype_of(name: str):
  """A dtype named in the config (config.DTYPES) as JAX's dtype object."""
  return jnp.dtype(name)


def normal(std: float, names: tuple[str | None, ...]):
  """A normal(0, std) initialiser whose parameter carries the logical axis `names`."""
  return nn.with_logical_partitioning(nn.initializers.normal(std), names)


def zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def constant(value: float, names: tuple[str | None, ...]):
  """An initialiser filling the parameter with `value`, carrying the logical axis `names`."""
  return nn.with_logical_partitioning(nn.initializers.constant(value), names)


def kernel_init(cfg, rule, names: tuple[str | None, ...], **axes):
  """A projection kernel's initialiser: normal(model.init_std), or a norm placement's `rule`
  (placement_base.Init; `axes` gives its fan axes) when the placement sets one."""
  if rule is None:
    return normal(cfg.init_std, names)
  return nn.with_logical_partitioning(rule.initializer(**axes), names)


def activation(name: str):
  """The pointwise non-linearity of a non-gated FFN, or the gate's non-linearity when gated
  (config.ACTIVATIONS)."""
  function, kwargs, _ = ACTIVATIONS[name]
  return functools.partial(getattr(jax.nn, function), **kwargs)


def dense(cfg, features, axis, kernel_names, bias_names, name, use_bias=None, rule=None):
  """nn.DenseGeneral with the config's dtypes, initialiser (or `rule`, see kernel_init) and
  logical axis names."""
  return nn.DenseGeneral(
      features=features,
      axis=axis,
      use_bias=cfg.use_bias if use_bias is None else use_bias,
      dtype=dtype_of(cfg.dtype),
      param_dtype=dtype_of(cfg.param_dtype),
      kernel_init=kernel_init(cfg, rule, kernel_names),
      bias_init=zeros(bias_names),
      name=name,
  )


class DenseWeights(nn.Module):
  """The kernel [*in_shape, *features] and bias [*features] that `nn.DenseGeneral` of the same
  name would hold (same shapes, initial values, logical names and parameter paths), returned in
  the compute dtype instead of applied: projections of one input then run as one matmul
  (`fused_dense`), and a kernel over several input axes (attention's [H, K, D] output) keeps its
  logical names whole. Called with the input shape it contracts (an int for one axis)."""

  cfg: "ModelConfig"  # noqa: F821
  features: tuple[int, ...]
  kernel_names: tuple[str | None, ...]
  bias_names: tuple[str | None, ...]
  rule: object = None  # a norm placement's initialiser rule (see kernel_init); None = normal

  @nn.compact
  def __call__(self, in_shape):
    c = self.cfg
    in_shape = (in_shape,) if isinstance(in_shape, int) else tuple(in_shape)
    n_in, n_out = int(np.prod(in_shape)), int(np.prod(self.features))

    def as_dense_general(init, flat_shape):  # nn.DenseGeneral draws the 2-D view, then reshapes
      def wrapped(rng, shape, dtype):
        value = init(rng, flat_shape, dtype)  # boxed with the names of the unflattened shape
        return value.replace(value=jnp.reshape(value.value, shape))

      return wrapped

    kernel = self.param(
        "kernel",
        as_dense_general(kernel_init(c, self.rule, self.kernel_names), (n_in, n_out)),
        (*in_shape, *self.features),
        dtype_of(c.param_dtype),
    )
    bias = None
    if c.use_bias:
      bias = self.param(
          "bias",
          as_dense_general(zeros(self.bias_names), (n_out,)),
          tuple(self.features),
          dtype_of(c.param_dtype),
      ).astype(dtype_of(c.dtype))
    return kernel.astype(dtype_of(c.dtype)), bias


def fused_dense(cfg, x, weights):
  """x [..., D] through n same-shaped projections (`DenseWeights` results) at once: the kernels
  are stacked on a new axis after D, so one matmul [..., D] x [D, n * features] computes all n
  (a wider matmul runs faster, and the backward pass has one input-gradient product instead of
  n). Returns the n outputs [..., *features], each what its own `dense` would give."""
  kernels = jnp.stack([w for w, _ in weights], axis=1)  # [D, n, *features]
  y = jnp.tensordot(x.astype(kernels.dtype), kernels, 1)  # [..., n, *features]
  if weights[0][1] is not None:
    y = y + jnp.stack([b for _, b in weights], axis=0)
  axis = y.ndim - kernels.ndim + 1  # the stacking axis in y
  # split, not indexing: its gradient is one concatenation rather than n padded copies
  return [part.squeeze(axis) for part in jnp.split(y, len(weights), axis=axis)]
