"""Multi-head attention with grouped key/value heads (MHA, GQA, MQA), self or cross.

Shapes: x [B, T, D], context [B, S, D]; q [B, T, H, K], k and v [B, S, G, K]; H % G == 0.
`mask` is an `AttentionMask` (modules/masks.py: segment ids, key padding and positions per
token, what the blockwise kernels read) or a dense boolean mask broadcastable to [B, H, T, S]
(True = may attend), or None.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import logging
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from transformers_jax.modules.common import (
    DenseWeights,
    adapter_dropout,
    constant,
    dtype_of,
    fused_dense,
    apply_projection,
    soft_cap,
)
from transformers_jax.modules.cache import attend_cache, cross_cached, write_cache
from transformers_jax.modules.context import context_size, split_attention
from transformers_jax.modules.flash import flash_attention
from transformers_jax.modules.masks import AttentionMask, as_dense, is_causal, with_window
from transformers_jax.modules.norms import Norm, norm_over_heads
from transformers_jax.modules.scores import dense_mask, max_attention_logit, whole_bias
from transformers_jax.modules.placement_base import ATTENTION_OUT_NORM, HEAD_GAIN, QKV_NORM
from transformers_jax.modules.positions import apply_rope, position_scheme
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
):
  """softmax(q k^T / sqrt(K) + bias + masks) v, softmax in float32; q [B, T, H, K], k v
  [B, S, G, K]; `bias` a position scheme's ScoreBias (modules/positions.py) or None.

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
  run it (`auto` picks one of them). Attention dropout (`dropout_fn` on the weights) always
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
    if impl == "splash" and bias is not None:  # (an explicit choice is refused by the config)
      logging.info("attention: splash takes no score bias; running flash for %s", bias.kind)
      impl = "flash"
    if impl == "splash" and blockwise:
      if mask is None or not (mask.has_positions or mask.needs_positions):
        return splash_attention(q, k, v, mask, causal, block_q, block_kv)
      impl = "flash"
    if impl == "flash" and blockwise:
      return flash_attention(q, k, v, mask, causal, block_q, block_kv, bias, softcap)
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
    return _attend(q, k, v, *dense, dropout_fn, impl, query_blocks, dense_bias, softcap)


def _attend(q, k, v, mask, causal, dropout_fn, impl, query_blocks, bias=None, cap=0.0):
  """The reference paths; `bias` [B or 1, G, R, T, S] float32 (whole_bias) or None; `cap` the
  scores' soft-cap (einsum only)."""
  if impl in ("fused", "cudnn") and dropout_fn is None:
    if bias is not None:  # the call takes it per query head: [B or 1, H, T, S]
      bias = bias.reshape(bias.shape[0], -1, *bias.shape[3:]).astype(q.dtype)
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
    w = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    if dropout_fn is not None:
      w = dropout_fn(w)
    outs.append(jnp.einsum("bgrts,bgsk->bgrtk", w, vh[:, :, :keys]))
  out = outs[0] if blocks == 1 else jnp.concatenate(outs, axis=3)
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, K)


def qk_norm(c, x, name: str):
  """Queries' or keys' norm x [B, T, N, K] (model.qk_norm_kind): per head over head_dim with one
  gain vector (head), over the whole projection N*K (full), or per head without parameters
  (l2: x / RMS(x))."""
  if c.qk_norm_kind == "full":
    return norm_over_heads(c, x, name)
  if c.qk_norm_kind == "l2":
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), -1, keepdims=True) + c.norm_eps)).astype(
        x.dtype
    )
  return Norm(c, axis="head_dim", name=name)(x)


class Attention(nn.Module):
  """Projections q, k, v, out; RoPE on self-attention; a key/value cache when `decode`.

  Decoding (`decode=True`), self-attention: the cache holds kv heads only ([B, G, L, K]), so
  GQA/MQA shrink it by H/G; L is the length of the `init` call's input (init with [B, L] dummy
  tokens for an L-slot cache). Each call writes its T keys/values at the cache index and
  attends over all L slots (`attend_cache`), slots after each query's own being masked; a
  caller's `mask` is over cache slots ([B, 1, 1, L], e.g. left padding). Cross-attention: the
  first call after `init` projects the context (the encoder output) and caches its keys/values;
  later calls reuse them and never look at `context` again. No attention dropout when decoding.
  """

  cfg: "ModelConfig"  # noqa: F821
  causal: bool = False
  deterministic: bool = True
  decode: bool = False
  # A norm placement's initialisers of query/key/value/out (placement_base.Init), as
  # ((projection, rule), ...), and the features it adds here (placement_base.FEATURES).
  init_rules: tuple = ()
  features: tuple[str, ...] = ()

  @nn.compact
  def __call__(
      self, x, context=None, mask=None, positions=None, bias=None, window=None, layer=None
  ):
    """`bias`: a position scheme's ScoreBias, `window`: a sliding window (int, or traced under
    a scan over layers), both for self-attention only; `layer`: the block's LayerAttention
    (modules/layer_types.py: its chunks and RoPE frequencies), None for the defaults."""
    c = self.cfg
    H, G, K, D = c.num_heads, c.kv_heads, c.head_width, c.d_model
    is_cross = context is not None
    q_names = (("embed", "heads", "head_dim"), ("heads", "head_dim"))
    kv_names = (("embed", "kv_heads", "head_dim"), ("kv_heads", "head_dim"))
    rules = dict(self.init_rules)
    qkv = dict(use_bias=c.use_bias if c.qkv_bias is None else c.qkv_bias)  # q, k, v's biases
    query = DenseWeights(c, (H, K), *q_names, rule=rules.get("query"), name="query", **qkv)
    key = DenseWeights(c, (G, K), *kv_names, rule=rules.get("key"), name="key", **qkv)
    value = DenseWeights(c, (G, K), *kv_names, rule=rules.get("value"), name="value", **qkv)
    lora_x = adapter_dropout(c, self.deterministic)  # LoRA's input (dropout while training)
    # Projections of one input with one shape run as one matmul (fused_dense).
    self_kv = None
    if not is_cross and G == H:
      q, *self_kv = fused_dense(c, x, [query(D), key(D), value(D)], lora_x(x))
    else:
      (q,) = fused_dense(c, x, [query(D)], lora_x(x))
    q = checkpoint_name(q, "query_proj")  # the names remat policies keep (modules/remat.py)
    q = nn.with_logical_constraint(q, ("act_batch", "act_length", "act_heads", None))
    if c.qk_norm:  # normalise the queries and keys (model.qk_norm_kind says over what)
      q = qk_norm(c, q, "query_norm")
    if QKV_NORM in self.features:
      q = norm_over_heads(c, q, "query_proj_norm")
    if not c.scale_scores:  # every path divides q.k by sqrt(K): T5 wants q.k as it is
      q = q * jnp.asarray(K**0.5, q.dtype)
    elif c.score_scale_width:  # q.k / sqrt(width) instead (Gemma 2 27B)
      q = q * jnp.asarray((K / c.score_scale_width) ** 0.5, q.dtype)

    def normed(k, v):  # keys and values as attention reads them (and the caches hold them)
      k, v = checkpoint_name(k, "key_proj"), checkpoint_name(v, "value_proj")
      if c.qk_norm:
        k = qk_norm(c, k, "key_norm")
      if QKV_NORM in self.features:
        k, v = norm_over_heads(c, k, "key_proj_norm"), norm_over_heads(c, v, "value_proj_norm")
      return k, v

    def project(source):
      if self_kv is not None:
        return normed(*self_kv)
      width = source.shape[-1]
      return normed(*fused_dense(c, source, [key(width), value(width)], lora_x(source)))

    # the pattern (modules/masks.py) is the mask's; a dense mask or None: the module's `causal`
    pattern = mask if isinstance(mask, AttentionMask) else AttentionMask(causal=self.causal)
    chunk = getattr(layer, "chunk", None)
    if self.decode:  # the cache paths take dense masks (over cache slots), the pattern apart
      mask = as_dense(mask)
    else:
      mask = with_window(mask, window, chunk)
    if self.decode and is_cross:  # keys/values of the context, projected once
      cross = cross_cached(self, project, context)
      out = attend_cache(q, *cross, mask, softcap=c.attention_softcap)
    else:
      k, v = project(context if is_cross else x)
      inv_freq = getattr(layer, "inv_freq", None)
      if not is_cross and inv_freq is not None:  # this block's own RoPE frequencies (or none)
        q, k = (apply_rope(y, positions, inv_freq=inv_freq) for y in (q, k))
      elif not is_cross:  # the position scheme's rotation (RoPE), if it has one
        q, k = position_scheme(c).rotate(c, q, k, positions)
      cache_args = (mask, bias, window, pattern, chunk, positions)
      if self.decode and self.has_variable("cache", "cached_key"):
        out = attend_cache(q, *write_cache(self, k, v, *cache_args), c.attention_softcap)
      else:
        if self.decode:
          write_cache(self, k, v, *cache_args)  # init: shape the cache
        causal = pattern.causal and not is_cross
        dropout_fn = None
        if c.attention_dropout > 0 and not self.deterministic:
          dropout_fn = nn.Dropout(c.attention_dropout, deterministic=False)
        blocks = (c.attention_block_q, c.attention_block_kv)
        core, logit_max = attend, max_attention_logit
        if context_size() > 1:  # the tokens split over mesh.context: modules/context.py
          core, logit_max = split_attention(
              attend, max_attention_logit, positions, c.context_strategy, blocks
          )
        if self.is_mutable_collection("intermediates"):  # evaluation: logit growth
          chosen = choose_impl(c.attention_impl, q, k, dropout_fn is not None)
          blockwise = blocks if chosen in ("flash", "splash") else None
          self.sow(
              "intermediates",
              "attention_logit_max",
              logit_max(q, k, mask, causal, blockwise, bias=bias, cap=c.attention_softcap),
          )
        out = core(
            q,
            k,
            v,
            mask,
            causal,
            dropout_fn,
            c.attention_impl,
            c.attention_query_blocks,
            *blocks,
            bias=bias,
            softcap=c.attention_softcap,
        )
    out = checkpoint_name(out, "context")
    if HEAD_GAIN in self.features:  # NormFormer: a learned gain per head, initialised to 1
      gain = self.param(
          "head_gain", constant(1.0, ("heads",)), (H,), dtype_of(c.param_dtype)
      ).astype(out.dtype)
      out = out * gain[:, None]
    if ATTENTION_OUT_NORM in self.features:
      out = norm_over_heads(c, out, "heads_out_norm")
    out_weights = DenseWeights(
        c, (D,), ("heads", "head_dim", "embed"), ("embed",), rule=rules.get("out"), name="out"
    )
    return checkpoint_name(apply_projection(out, out_weights((H, K)), 2, lora_x(out)), "out_proj")
