"""Small helpers shared by the modules: dtypes, initialisers with logical axis names, registry
entries' summaries."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformers_jax.modules import inits, lora, parametrization, quantization

# the activations' registry (modules/activations.py), which the modules also take from here
from transformers_jax.modules.activations import ACTIVATIONS as ACTIVATIONS
from transformers_jax.modules.activations import activation as activation


def summary_of(entry) -> str:
  """A registry entry's one-line description (--config_help, docs/config.md and
  docs/architecture.md show it): its `summary`, else the first paragraph of its class's
  docstring on one line."""
  own = getattr(entry, "summary", "")
  if own:
    return own
  doc = type(entry).__doc__ or ""
  return " ".join(doc.strip().split("\n\n")[0].split())


def soft_cap(x, cap: float):
  """Gemma 2's soft-capping: cap tanh(x / cap), which keeps scores (or logits) within +-cap;
  `cap` 0 leaves them as they are."""
  return x if not cap else cap * jnp.tanh(x / cap)


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
  """A projection kernel's initialiser: `rule` (placement_base.Init; `axes` gives its fan
  axes) where the initialisation or the norm placement sets one for it, else the
  initialisation's default (modules/inits.py; model.init=gpt2: normal(model.init_std)); then
  rescaled for the tensor's role (read off `names`) by model.parametrization."""
  rule = inits.default_rule(cfg) if rule is None else rule
  rule = parametrization.kernel_rule(cfg, names, rule)
  return nn.with_logical_partitioning(rule.initializer(**axes), names)


def dense(
    cfg, features, axis, kernel_names, bias_names, name, use_bias=None, rule=None, quantized=""
):
  """nn.DenseGeneral with the config's dtypes, initialiser (or `rule`, see kernel_init) and
  logical axis names; its matmul in the `quantized` mode (modules/quantization.py, '' = float)."""
  return nn.DenseGeneral(
      features=features,
      axis=axis,
      use_bias=cfg.use_bias if use_bias is None else use_bias,
      dtype=dtype_of(cfg.dtype),
      param_dtype=dtype_of(cfg.param_dtype),
      kernel_init=kernel_init(cfg, rule, kernel_names),
      bias_init=zeros(bias_names),
      name=name,
      dot_general=quantization.dot_general(quantized),
  )


class Projection(NamedTuple):
  """A projection's weights in the compute dtype: `kernel` [*in, *out], `bias` [*out] or None,
  and `adapter`: None, or LoRA's (A [*in, r], B [r, *out]) with B already scaled by alpha / r,
  whose product is added to the kernel's (`apply_projection`, `fused_dense`); `quantization`:
  the mode (modules/quantization.py) the kernel's matmul runs in ('' = float; the adapters
  always run in float)."""

  kernel: jax.Array
  bias: jax.Array | None
  adapter: tuple[jax.Array, jax.Array] | None = None
  quantization: str = ""


class DenseWeights(nn.Module):
  """The kernel [*in_shape, *features] and bias [*features] that `nn.DenseGeneral` of the same
  name would hold (same shapes, initial values, logical names and parameter paths), returned in
  the compute dtype instead of applied (a `Projection`): projections of one input then run as
  one matmul (`fused_dense`), and a kernel over several input axes (attention's [H, K, D]
  output) keeps its logical names whole. Called with the input shape it contracts (an int for
  one axis). When the config's LoRA adapts this projection (`model.lora_targets` names it) it
  also holds `lora_a` [*in_shape, r] and `lora_b` [r, *features] (zeros at init)."""

  cfg: "ModelConfig"  # noqa: F821
  features: tuple[int, ...]
  kernel_names: tuple[str | None, ...]
  bias_names: tuple[str | None, ...]
  rule: object = None  # a norm placement's initialiser rule (see kernel_init); None = normal
  use_bias: bool | None = None  # None = model.use_bias

  @nn.compact
  def __call__(self, in_shape) -> Projection:
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
    if c.use_bias if self.use_bias is None else self.use_bias:
      bias = self.param(
          "bias",
          as_dense_general(zeros(self.bias_names), (n_out,)),
          tuple(self.features),
          dtype_of(c.param_dtype),
      ).astype(dtype_of(c.dtype))
    adapter = None
    if self.name in lora.projections(c):
      r, in_names = c.lora_rank, self.kernel_names[: len(in_shape)]
      out_names = self.kernel_names[len(in_shape) :]
      a = self.param(
          "lora_a", lora.a_init(n_in, (*in_names, None)), (*in_shape, r), dtype_of(c.param_dtype)
      )
      b = self.param(
          "lora_b", zeros((None, *out_names)), (r, *self.features), dtype_of(c.param_dtype)
      )
      scale = c.lora_alpha / c.lora_rank
      adapter = (a.astype(dtype_of(c.dtype)), (b * scale).astype(dtype_of(c.dtype)))
    return Projection(kernel.astype(dtype_of(c.dtype)), bias, adapter, c.quantization)


def adapter_dropout(cfg, deterministic: bool):
  """x -> the LoRA adapters' input: x, or x with model.lora_dropout while training (called
  inside the module whose projections it feeds, so each call draws its own mask)."""
  if not cfg.lora_rank or not cfg.lora_dropout or deterministic:
    return lambda x: None  # `apply_projection` and `fused_dense` then read x itself
  return lambda x: nn.Dropout(cfg.lora_dropout, deterministic=False)(x)


def apply_projection(x, weights: Projection, contract: int = 1, adapter_input=None):
  """x [..., *in] (its last `contract` axes) through one projection: x W (+ b) (+ the LoRA
  adapter's (x' A) B, x' = `adapter_input`, by default x: dropout on the adapter's input is
  the caller's)."""
  kernel, bias, adapter, mode = weights
  y = quantization.tensordot(x.astype(kernel.dtype), kernel, contract, mode)
  if bias is not None:
    y = y + bias
  if adapter is not None:
    a, b = adapter
    source = x if adapter_input is None else adapter_input
    y = y + jnp.tensordot(jnp.tensordot(source.astype(a.dtype), a, contract), b, 1)
  return y


def fused_dense(cfg, x, weights, adapter_input=None):
  """x [..., D] through n same-shaped projections (`DenseWeights` results) at once: the kernels
  are stacked on a new axis after D, so one matmul [..., D] x [D, n * features] computes all n
  (a wider matmul runs faster, and the backward pass has one input-gradient product instead of
  n). Returns the n outputs [..., *features], each what its own `apply_projection` would give
  (LoRA adapters, where a projection has one, added to its own output; `adapter_input` as
  there). The stacked matmul is quantized as one (per-channel scales over the n * features
  output channels, so each projection's channels keep their own)."""
  kernels = jnp.stack([w.kernel for w in weights], axis=1)  # [D, n, *features]
  y = quantization.tensordot(x.astype(kernels.dtype), kernels, 1, weights[0].quantization)
  if weights[0].bias is not None:
    y = y + jnp.stack([w.bias for w in weights], axis=0)
  axis = y.ndim - kernels.ndim + 1  # the stacking axis in y
  # split, not indexing: its gradient is one concatenation rather than n padded copies
  outs = [part.squeeze(axis) for part in jnp.split(y, len(weights), axis=axis)]
  source = x if adapter_input is None else adapter_input
  for i, w in enumerate(weights):
    if w.adapter is not None:
      a, b = w.adapter
      outs[i] = outs[i] + jnp.tensordot(jnp.tensordot(source.astype(a.dtype), a, 1), b, 1)
  return outs
