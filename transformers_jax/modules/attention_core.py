"""The attention core: softmax(q k^T / sqrt(K) + bias + masks) v by the implementation the config
and the platform choose (einsum, fused, cuDNN, flash, splash). Shapes as in modules/attention.py,
which re-exports these names."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import logging

from transformers_jax.modules.common import soft_cap
from transformers_jax.modules.flash import flash_attention
from transformers_jax.modules.masks import AttentionMask, is_causal
from transformers_jax.modules.scores import dense_mask, whole_bias
from transformers_jax.modules.sinks import grouped, softmax_with_sink, with_sink_key
from transformers_jax.modules.splash import splash_attention, target_platform

# `auto` on a CPU (or a GPU computing in float32) takes flash from this many queries or keys on:
# below it the written-out scores are small and einsum is as fast (see docs/long_context.md).
AUTO_FLASH_MIN_LENGTH = 2048


def choose_impl(impl: str, q, k, dropout: bool) -> str:
  """The implementation `attend` runs for `impl` (see there): "auto" resolved by the platform
  compiled for, the dtype and the lengths; dropout always takes "einsum"."""
  if dropout:
    return "einsum"
  platform = target_platform()
  if impl == "cudnn" and platform not in ("gpu", "cuda"):  # (else "cuDNN is not detected")
    raise ValueError(
        f"model.attention_impl='cudnn' needs an NVIDIA GPU, and this step compiles for "
        f"{platform}: use auto (the platform's best), flash or einsum"
    )
  if impl != "auto":
    return impl
  if platform == "tpu":
    return "splash"
  if platform == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16):
    return "cudnn"  # falls back to flash where cuDNN refuses
  return "flash" if max(q.shape[1], k.shape[1]) >= AUTO_FLASH_MIN_LENGTH else "einsum"


def attend(
    q,
    k,
    v,
    mask,
    causal: bool,
    dropout_fn=None,
    impl: str = "auto",
    query_blocks: int = 4,
    block_q: int = 512,
    block_kv: int = 512,
    bias=None,
    softcap: float = 0.0,
    sinks=None,
):
  """softmax(q k^T / sqrt(K) + bias + masks) v, softmax in float32; q [B, T, H, K], k v
  [B, S, G, K]; `bias` a position scheme's ScoreBias (modules/positions.py) or None; `sinks`
  [H] float32 attention sinks (modules/sinks.py: a logit per head in every denominator) or None.

  `impl`:
    "einsum" writes the products out heads-major (the readable reference) and, when `causal`,
      splits the queries into `query_blocks` blocks (of at least 64 queries), each attending
      only the keys up to its own end, so most masked scores are never computed (5/8 of the
      work for 4 blocks);
    "fused" is `jax.nn.dot_product_attention` with JAX's default implementation (XLA's, which
      computes every score and then masks); "cudnn" is the same call with cuDNN's fused kernel
      (an error where cuDNN cannot run it). These three build the dense [B, 1, T, S] mask.
    "flash" is blockwise attention in plain JAX (modules/flash.py: memory linear in T, blocks of
      `block_q` queries x `block_kv` keys, any backend);
    "splash" is TPU Pallas splash attention (modules/splash.py; interpret mode off a TPU;
      masks with positions, and any score bias, go to flash);
    "auto" is splash on a TPU; on a GPU computing in bfloat16 or float16 cuDNN (flash where
      cuDNN refuses the shapes or mask); elsewhere flash when T or S >= AUTO_FLASH_MIN_LENGTH,
      else einsum.
  `softcap` (Gemma 2's, 0 = none) caps the scores at +-softcap before the mask; flash and einsum
  run it (`auto` picks one of them). Sinks run on every path but cuDNN's (flash, or einsum for a
  dense mask, instead). Attention dropout (`dropout_fn` on the weights) always
  takes "einsum". What a query may attend is the mask's pattern (modules/masks.py: causal, a
  bidirectional prefix, a window, chunks, segments); `causal` only says it for a dense mask or
  None: key j > query i masked (queries and keys aligned at the start).
  """
  with jax.named_scope("attention_core"):  # profiles (scripts/profile_train.py) look for it
    causal = is_causal(mask, causal)
    requested, impl = impl, choose_impl(impl, q, k, dropout_fn is not None)
    blockwise = isinstance(mask, AttentionMask) or mask is None
    if softcap and impl in ("splash", "cudnn", "fused"):  # their kernels cannot cap the scores
      impl = "flash" if blockwise else "einsum"
    if sinks is not None and impl == "cudnn":  # (an explicit choice is refused by the config)
      impl = "flash" if blockwise else "einsum"
    if impl == "splash" and bias is not None:  # (an explicit choice is refused by the config)
      logging.info("attention: splash takes no score bias; running flash for %s", bias.kind)
      impl = "flash"
    if impl == "splash" and blockwise:
      if mask is None or not (mask.has_positions or mask.needs_positions):
        return splash_attention(q, k, v, mask, causal, block_q, block_kv, sinks)
      impl = "flash"
    if impl == "flash" and blockwise:
      return flash_attention(q, k, v, mask, causal, block_q, block_kv, bias, softcap, sinks)
    dense_bias = None if bias is None else whole_bias(bias, mask, q, k)
    if impl == "cudnn" and requested == "auto":
      try:
        dense = dense_mask(mask, causal, q.shape[1], k.shape[1])
        return _attend(q, k, v, *dense, None, "cudnn", query_blocks, dense_bias)
      except (ValueError, NotImplementedError, RuntimeError):  # cuDNN refuses them, or is absent
        if blockwise:
          return flash_attention(q, k, v, mask, causal, block_q, block_kv, bias, softcap)
        impl = "einsum"
    if impl in ("flash", "splash"):  # a dense mask: only the reference path reads it
      impl = "einsum"
    dense = dense_mask(mask, causal, q.shape[1], k.shape[1])
    return _attend(q, k, v, *dense, dropout_fn, impl, query_blocks, dense_bias, softcap, sinks)


def _attend(q, k, v, mask, causal, dropout_fn, impl, query_blocks, bias=None, cap=0.0, sinks=None):
  """The reference paths; `bias` [B or 1, G, R, T, S] float32 (whole_bias) or None; `cap` the
  scores' soft-cap (einsum only); `sinks` [H] or None."""
  if impl in ("fused", "cudnn") and dropout_fn is None:
    if bias is not None:  # the call takes it per query head: [B or 1, H, T, S]
      bias = bias.reshape(bias.shape[0], -1, *bias.shape[3:]).astype(q.dtype)
    if sinks is not None:  # one more key: zeros, its score the sink (modules/sinks.py)
      k, v, mask, bias = with_sink_key(k, v, mask, causal, bias, sinks, q.shape[1])
      causal = False
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias=bias,
        mask=mask,
        is_causal=causal,
        implementation="cudnn" if impl == "cudnn" else None,
    )
  B, T, H, K = q.shape
  S, G = k.shape[1], k.shape[2]
  R = H // G  # query heads per key/value head
  qh = q.reshape(B, T, G, R, K).transpose(0, 2, 3, 1, 4)  # [B, G, R, T, K]
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, G, S, K]
  if mask is not None:  # -> [B or 1, G or 1, R or 1, T or 1, S or 1]
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    mask = (
        mask[:, None] if mask.shape[1] == 1 else mask.reshape(mask.shape[0], G, R, *mask.shape[2:])
    )
  blocks = max(1, min(query_blocks, T // 64)) if causal else 1
  edges = [T * i // blocks for i in range(blocks + 1)]
  scale = 1.0 / float(K) ** 0.5  # on the float32 scores
  sink = None if sinks is None else grouped(sinks, G)[None, :, :, None, None]
  outs = []
  for start, end in zip(edges[:-1], edges[1:]):
    keys = min(end, S) if causal else S  # keys after the block's last query are all masked
    s = (
        jnp.einsum(
            "bgrtk,bgsk->bgrts",
            qh[:, :, :, start:end],
            kh[:, :, :keys],
            preferred_element_type=jnp.float32,
        )
        * scale
    )
    if bias is not None:
      s = s + bias[:, :, :, start:end, :keys]
    s = soft_cap(s, cap)
    m = None
    if causal:
      m = jnp.arange(start, end)[:, None] >= jnp.arange(keys)[None, :]
    if mask is not None:
      mm = mask[..., start:end, :] if mask.shape[3] > 1 else mask
      mm = mm[..., :keys] if mm.shape[4] > 1 else mm
      m = mm if m is None else m & mm
    if m is not None:
      s = jnp.where(m, s, jnp.finfo(jnp.float32).min)
    w = softmax_with_sink(s, sink).astype(v.dtype)
    if dropout_fn is not None:
      w = dropout_fn(w)
    outs.append(jnp.einsum("bgrts,bgsk->bgrtk", w, vh[:, :, :keys]))
  out = outs[0] if blocks == 1 else jnp.concatenate(outs, axis=3)
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, K)
