"""Quantized matmuls (`model.quantization`, docs/quantization.md): the Block's projections and
MoE experts through qwix's quantized dot_general, which quantizes its operands per channel
(absmax over the contracted axes, recomputed on every call: "current" scaling, no state) and
carries straight-through gradients (qwix's custom VJP; the backward products quantized too).

  ""            float: the matmuls as they were
  int8          int8 weights and activations forward, int8 gradients backward
  fp8           float8 e4m3 weights and activations forward, e5m2 gradients backward
  int8_weights  int8 weights only (activations and gradients in the compute dtype): decoding

Nothing here adds a parameter or a variable: the kernels stay in param_dtype, a checkpoint is
the same with quantization on or off, and a resume may switch it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# mode -> (forward operand type, gradient type); int8_weights quantizes the weight operand only
MODES = {
    "": (None, None),
    "int8": (jnp.int8, jnp.int8),
    "fp8": (jnp.float8_e4m3fn, jnp.float8_e5m2),
    "int8_weights": (jnp.int8, None),
}
# Device kinds whose matrix units multiply float8 (XLA runs fp8 on any backend by widening the
# operands, which costs time and gains nothing): NVIDIA Ada/Hopper/Blackwell and TPU v7.
FP8_GPU_MIN_CAPABILITY = 8.9


def qwix_dot_general_qt():
  """qwix's quantized dot_general module (qwix._src.core.dot_general_qt: the op its QtProvider
  runs, called directly so that the projections need no module-path rules), or None when qwix
  is not installed."""
  try:
    from qwix._src.core import dot_general_qt
  except ImportError:
    return None
  return dot_general_qt


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) when model.quantization names no mode, or None."""
  if c.quantization not in MODES:
    names = ", ".join(repr(m) for m in MODES)
    return "quantization", repr(c.quantization), f"one of {names} ('' = float matmuls)"
  if c.quantization and qwix_dot_general_qt() is None:
    return "quantization", repr(c.quantization), "needs qwix: pip install -e '.[quant]'"
  if c.quantization and c.feed_forward == "moe" and c.moe_impl == "ragged":
    fix = "the grouped expert matmul has no quantized form here: use moe_impl=dense, or ''"
    return "quantization", repr(c.quantization), fix
  if c.kv_cache_dtype not in KV_CACHE_DTYPES:
    fix = "'' (the compute dtype) or int8 (per-token, per-head scales)"
    return "kv_cache_dtype", repr(c.kv_cache_dtype), fix
  if c.kv_cache_dtype and qwix_dot_general_qt() is None:
    return "kv_cache_dtype", repr(c.kv_cache_dtype), "needs qwix: pip install -e '.[quant]'"
  if c.quantization_head and not c.quantization:
    return "quantization_head", "True", "quantizes the output head: set model.quantization too"
  return None


def qt_config(mode: str, weight_is_rhs: bool = True):
  """qwix's DotGeneralQtConfig for `mode` (None for float), as qwix's QtProvider builds it from
  a QtRule(weight_qtype=q, act_qtype=q, bwd_qtype=g): per-channel absmax scales, the forward's
  quantized operands reused as the backward's residuals where the gradients are quantized."""
  forward, grads = MODES[mode]
  if forward is None:
    return None
  dot_general_qt = qwix_dot_general_qt()
  if mode == "int8_weights":  # the weight alone; the backward multiplies by the float operands
    lhs, rhs = (None, forward) if weight_is_rhs else (forward, None)
    return dot_general_qt.DotGeneralQtConfig(
        lhs_qtype=lhs, rhs_qtype=rhs, use_original_residuals=True
    )
  return dot_general_qt.DotGeneralQtConfig(
      lhs_qtype=forward,
      rhs_qtype=forward,
      dlhs_grad_qtype=grads,
      drhs_grad_qtype=grads,
  )


def tensordot(x, kernel, contract: int, mode: str):
  """jnp.tensordot(x, kernel, contract) (x's last `contract` axes against kernel's first), through
  qwix's quantized dot_general when `mode` is set."""
  if not MODES[mode][0]:
    return jnp.tensordot(x, kernel, contract)
  dims = ((tuple(range(x.ndim - contract, x.ndim)), tuple(range(contract))), ((), ()))
  return dot_general(mode)(x, kernel, dims)


def einsum(spec: str, x, weight, mode: str):
  """jnp.einsum(spec, x, weight) of an activation and a weight (MoE experts' batched products),
  each of jnp.einsum's dot_generals through qwix's quantized one when `mode` is set."""
  if not MODES[mode][0]:
    return jnp.einsum(spec, x, weight)

  dot_general_qt = qwix_dot_general_qt()

  def quantized_dot_general(lhs, rhs, dimension_numbers, precision=None, **_):
    # jnp.einsum may hand the operands over in either order: the weight is the one of its shape
    config = qt_config(mode, weight_is_rhs=rhs.shape == weight.shape)
    return dot_general_qt.dot_general_qt(lhs, rhs, dimension_numbers, config)

  return jnp.einsum(spec, x, weight, _dot_general=quantized_dot_general).astype(x.dtype)


def dot_general(mode: str):
  """A jax.lax.dot_general stand-in (nn.DenseGeneral's `dot_general`) of an activation (lhs) and
  a kernel (rhs) quantized as `mode` says, or jax.lax.dot_general itself for float."""
  config = qt_config(mode)
  if config is None:
    return jax.lax.dot_general
  dot_general_qt = qwix_dot_general_qt()

  def quantized(lhs, rhs, dimension_numbers, precision=None, **_):
    return dot_general_qt.dot_general_qt(lhs, rhs, dimension_numbers, config).astype(lhs.dtype)

  return quantized


KV_CACHE_DTYPES = ("", "int8")  # model.kv_cache_dtype: '' = the compute dtype


def kv_quantize(x):
  """Keys or values x [B, G, T, K] -> (int8 [B, G, T, K], float32 scales [B, G, T, 1]): one
  absmax scale per token and kv head (qwix.quantize), as the int8 KV cache stores them."""
  import qwix

  quantized = qwix.quantize(x, jnp.int8, channelwise_axes=(0, 1, 2), scale_dtype=jnp.float32)
  return quantized.qvalue, quantized.scale


def kv_dequantize(values, scales, dtype):
  """`kv_quantize`'s (int8, scales) back to `dtype` (qwix.dequantize)."""
  import qwix

  return qwix.dequantize(qwix.QArray(values, scales, None, jnp.int8)).astype(dtype)


def describe(c) -> str:
  """The matmuls' mode for a run's first line ('' for float): ", int8 matmuls (head in float)"."""
  if not c.quantization:
    return ""
  return (
      f", {c.quantization} matmuls (head {c.quantization if c.quantization_head else 'in float'})"
  )


def decoding_config(cfg, mode: str, kv_cache_dtype: str):
  """The run's model config with generate's --quantization `mode` (int8: weights only, the
  activations in the compute dtype) and --kv_cache_dtype; the parameters are the same either
  way. (Here, not in generate.py, so that the library and tests need not import a command
  line's flags.)"""
  import dataclasses

  changes = {"kv_cache_dtype": kv_cache_dtype} if kv_cache_dtype else {}
  if mode == "int8":
    changes["quantization"] = "int8_weights"
  return dataclasses.replace(cfg, **changes) if changes else cfg


def head_mode(c) -> str:
  """The mode the output head's matmul runs in: float unless model.quantization_head."""
  return c.quantization if c.quantization_head else ""


def platform_problem(c, devices) -> str | None:
  """Why the devices the step compiles for cannot run model.quantization=fp8 usefully, or None.
  CPU runs it (XLA widens the float8 operands), which the tests use."""
  if c.quantization != "fp8" or not len(devices):
    return None
  device = devices[0]
  kind = (getattr(device, "device_kind", "") or device.platform).lower()
  if device.platform in ("gpu", "cuda"):
    capability = float(getattr(device, "compute_capability", "0") or 0)
    if capability < FP8_GPU_MIN_CAPABILITY:
      return f"{kind} (compute capability {capability}) has no float8 matrix units"
  if device.platform == "tpu" and not any(v in kind for v in ("v7", "7x", "ironwood")):
    return f"{device.device_kind} has no float8 matrix units (int8 it has)"
  return None


def platform_check(c, devices) -> None:
  """Refuses model.quantization=fp8 (a ValueError naming the fix) where `platform_problem`."""
  problem = platform_problem(c, devices)
  if problem:
    raise ValueError(
        f"model.quantization='fp8': {problem}: use int8 (--config.model.quantization=int8), "
        "or '' for float matmuls"
    )
