"""MXFP4 (the OCP Microscaling format's FP4 variant), as gpt-oss's released files store their
expert matrices: each block of 32 values along a matrix's input axis is 32 four-bit E2M1 codes
(two a byte, the low nibble first: `*_blocks` [E, out, in / 32, 16] uint8) times one shared
power of two (E8M0, exponent biased by 127: `*_scales` [E, out, in / 32] uint8). Read into
floating-point matrices [E, in, out] as a checkpoint's tensors are taken, one at a time."""

from __future__ import annotations

import numpy as np

# The 16 E2M1 codes' values: sign bit, 2 exponent bits, 1 mantissa bit.
E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """blocks [..., G, 16] uint8 and scales [..., G] uint8 -> values [..., 32 G] float32."""
  values = np.empty(blocks.shape[:-1] + (32,), np.float32)
  values[..., 0::2] = E2M1[blocks & 0x0F]
  values[..., 1::2] = E2M1[blocks >> 4]
  values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
  return values.reshape(blocks.shape[:-2] + (-1,))


def expert_matrices(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """An MXFP4 expert stack (blocks [E, out, G, 16], scales [E, out, G]) as the floating-point
  tensor of the same name, [E, 32 G, out], one expert at a time."""
  E, out, G, _ = blocks.shape
  matrices = np.empty((E, 32 * G, out), np.float32)
  for e in range(E):
    matrices[e] = dequantize(blocks[e], scales[e]).T
  return matrices


def packed_experts(tensors) -> None:
  """Each `<name>_blocks` / `<name>_scales` pair of `tensors` (interop.tensor_files.TensorFiles)
  replaced by `<name>`, dequantized when it is taken."""
  for name in [n for n in tensors if n.endswith("_blocks")]:
    base = name.removesuffix("_blocks")
    if base + "_scales" not in tensors:
      continue
    E, out, G, _ = tensors.shape(name)
    tensors.derive(base, [name, base + "_scales"], (E, 32 * G, out), expert_matrices)
