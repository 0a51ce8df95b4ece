"""Small helpers shared by the modules: dtypes, initialisers with logical axis names, activations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_of(name: str):
  return DTYPES[name]


def normal(std: float, names: tuple[str | None, ...]):
  """A normal(0, std) initialiser whose parameter carries the logical axis `names`."""
  return nn.with_logical_partitioning(nn.initializers.normal(std), names)


def zeros(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def activation(name: str):
  """The pointwise non-linearity of a non-gated FFN, or the gate's non-linearity when gated."""
  return {
      "relu": jax.nn.relu,
      "gelu": lambda x: jax.nn.gelu(x, approximate=False),
      "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
      "swiglu": jax.nn.silu,
      "geglu": lambda x: jax.nn.gelu(x, approximate=False),
  }[name]


def dense(cfg, features, axis, kernel_names, bias_names, name, use_bias=None):
  """nn.DenseGeneral with the config's dtypes, initialiser and logical axis names."""
  return nn.DenseGeneral(
      features=features,
      axis=axis,
      use_bias=cfg.use_bias if use_bias is None else use_bias,
      dtype=dtype_of(cfg.dtype),
      param_dtype=dtype_of(cfg.param_dtype),
      kernel_init=normal(cfg.init_std, kernel_names),
      bias_init=zeros(bias_names),
      name=name,
  )
