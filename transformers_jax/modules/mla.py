"""Multi-head latent attention (DeepSeek-V2, Liu et al. 2024; DeepSeek-V3), the self-attention
of a Block when `model.kv_lora_rank` > 0.

Per token x [D], with H heads, C = kv_lora_rank, N = qk_nope_head_dim, R = qk_rope_head_dim,
V = v_head_dim:
  c_kv = RMSNorm(x W_DKV)  [C]          the compressed latent of keys and values
  k_R  = RoPE(x W_KR)      [R]          the decoupled key, one for every head
  k_h  = [c_kv W_UK,h ; k_R]  [N + R]   v_h = c_kv W_UV,h  [V]
  q_h  = [c_q W_UQ,h ; RoPE(c_q W_QR,h)]  with c_q = RMSNorm(x W_DQ) (q_lora_rank Q > 0) or x
and softmax(q_h . k_h / sqrt(N + R)) v_h per head, then the output projection. W_DKV and W_KR
are one matrix `kv_down` [D, C + R], W_UK and W_UV one `kv_up` [C, H, N + V], W_DQ `query_down`
[D, Q] and W_UQ, W_QR one `query_up` [Q, H, N + R] (or `query` [D, H, N + R]); the RMSNorms
on the latents (`query_latent_norm`, `kv_latent_norm`) have DeepSeek's fixed epsilon 1e-6.
With YaRN's RoPE scaling every score is also multiplied by m(s, mscale_all_dim)^2
(modules/yarn.py), as DeepSeek-V3 does. Projection biases, with `model.use_bias`, sit on
query_down, kv_down and out only (transformers' `attention_bias`).

Training runs the expanded form: the keys and values of every head, through any attention
implementation (values zero-padded to the query width where they are narrower, since the
kernels take one head width; the padding is sliced off). Decoding runs the absorbed form and
caches only [c_kv ; k_R] per token (C + R values, 576 for DeepSeek-V3, against 2 H K for
multi-head attention): W_UK is absorbed into the query (q_h W_UK,h^T . c_kv equals q_h . k_h on
the first N features), so every head attends the one cached latent as multi-query attention
whose values are the latent itself, and W_UV is applied to the attended latent afterwards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from transformers_jax.modules import lora, quantization
from transformers_jax.modules.attention import attend
from transformers_jax.modules.cache import attend_cache, write_cache
from transformers_jax.modules.common import DenseWeights, apply_projection, dtype_of, ones
from transformers_jax.modules.context import context_size, split_attention
from transformers_jax.modules.masks import AttentionMask, as_dense, with_window
from transformers_jax.modules.placement_base import ATTENTION_OUT_NORM, HEAD_GAIN, QKV_NORM
from transformers_jax.modules.placements import PLACEMENTS
from transformers_jax.modules.positions import position_scheme
from transformers_jax.modules.scores import max_attention_logit
from transformers_jax.modules import layer_types
from transformers_jax.modules.yarn import parse_yarn

LATENT_NORM_EPS = 1e-6  # DeepSeek-V2/V3's RMSNorm on the latents, whatever rms_norm_eps says


class LatentNorm(nn.Module):
  """RMSNorm over the last axis with a learned scale (`scale`), statistics in float32."""

  cfg: "ModelConfig"  # noqa: F821

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), -1, keepdims=True) + LATENT_NORM_EPS)
    scale = self.param("scale", ones((None,)), (x.shape[-1],), dtype_of(c.param_dtype))
    return (y * scale.astype(jnp.float32)).astype(dtype_of(c.dtype))


def score_factor(c) -> float:
  """What the queries are multiplied by so that every path's q.k / sqrt(N + R) is the score
  DeepSeek's attention computes: YaRN's m^2 (1 without it), and T5-style unscaled scores or a
  score width as the plain attention reads them."""
  factor = 1.0
  scaling = parse_yarn(c.rope_scaling) if c.positions == "rope" else None
  if scaling is not None:
    factor *= scaling.softmax_scale
  width = c.qk_nope_head_dim + c.qk_rope_head_dim
  if not c.scale_scores:
    factor *= width**0.5
  elif c.score_scale_width:
    factor *= (width / c.score_scale_width) ** 0.5
  return factor


def joint_projection(c, x, weights):
  """x [..., D] through projections of x with different widths as one matmul (their kernels
  and biases concatenated on the output axis), quantized as model.quantization says (per output
  channel, so each projection keeps its own scales): the list of their outputs."""
  kernel = jnp.concatenate([w.kernel for w in weights], axis=-1)
  y = quantization.tensordot(x.astype(kernel.dtype), kernel, 1, weights[0].quantization)
  if weights[0].bias is not None:
    y = y + jnp.concatenate([w.bias for w in weights], axis=-1)
  edges = [w.kernel.shape[-1] for w in weights]
  return jnp.split(y, [sum(edges[: i + 1]) for i in range(len(edges) - 1)], axis=-1)


class MLA(nn.Module):
  """Multi-head latent attention (see the module docstring); called as Attention is for
  self-attention: x [B, T, D], mask, positions, a position scheme's score bias, a window."""

  cfg: "ModelConfig"  # noqa: F821
  causal: bool = False
  deterministic: bool = True
  decode: bool = False
  init_rules: tuple = ()  # as Attention's: query / key / value / out initialisers
  features: tuple[str, ...] = ()

  @nn.compact
  def __call__(self, x, mask=None, positions=None, bias=None, window=None):
    c = self.cfg
    H, D, C = c.num_heads, c.d_model, c.kv_lora_rank
    N, R, V, Q = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.q_lora_rank
    rules = dict(self.init_rules)
    heads = ("latent", "heads", "head_dim")  # the up-projections, split over fsdp by `latent`

    def weights(name, features, names, rule, in_width, use_bias=False):
      bias_names = names[-len(features) :]
      kw = dict(rule=rules.get(rule), use_bias=use_bias and c.use_bias, name=name)
      return DenseWeights(c, features, names, bias_names, **kw)(in_width)

    kv_down = weights("kv_down", (C + R,), ("embed", None), "key", D, True)
    if Q:
      q_down = weights("query_down", (Q,), ("embed", None), "query", D, True)
      q_latent, kv = joint_projection(c, x, [q_down, kv_down])
      q_up = weights("query_up", (H, N + R), heads, "query", Q)
      q = apply_projection(LatentNorm(c, name="query_latent_norm")(q_latent), q_up)
    else:
      q_proj = weights("query", (H, N + R), ("embed", "heads", "head_dim"), "query", D)
      q, kv = apply_projection(x, q_proj), apply_projection(x, kv_down)
    q = checkpoint_name(q, "query_proj")
    q = nn.with_logical_constraint(q, ("act_batch", "act_length", "act_heads", None))
    latent = LatentNorm(c, name="kv_latent_norm")(kv[..., :C])  # c_kv [B, T, C]
    q_nope, q_rope = q[..., :N], q[..., N:]
    q_rope, k_rope = position_scheme(c).rotate(c, q_rope, kv[..., None, C:], positions)
    factor = score_factor(c)
    kv_up = weights("kv_up", (H, N + V), heads, "value", C)
    pattern = mask if isinstance(mask, AttentionMask) else AttentionMask(causal=self.causal)
    mask = as_dense(mask) if self.decode else with_window(mask, window)
    if self.decode:  # the absorbed form over the cached latents
      cached = jnp.concatenate([latent, k_rope[:, :, 0].astype(latent.dtype)], axis=-1)[:, :, None]
      written = write_cache(self, cached, None, mask, bias, window, pattern)
      if written is not None:
        w_uk, w_uv = kv_up.kernel[..., :N], kv_up.kernel[..., N:]  # [C, H, N], [C, H, V]
        absorbed = jnp.einsum("bthn,chn->bthc", q_nope, w_uk)
        query = jnp.concatenate([absorbed, q_rope.astype(absorbed.dtype)], axis=-1)
        query = query * jnp.asarray(factor * ((C + R) / (N + R)) ** 0.5, query.dtype)
        attended = attend_cache(query, *written, c.attention_softcap)  # values: the latents
        out = jnp.einsum("bthc,chv->bthv", attended[..., :C], w_uv)
        return self.project_out(out, rules)
    kvu = apply_projection(latent, kv_up)  # [B, T, H, N + V]
    k = jnp.concatenate([kvu[..., :N], jnp.broadcast_to(k_rope, q_rope.shape)], axis=-1)
    q = jnp.concatenate([q_nope, q_rope], axis=-1) * jnp.asarray(factor, q.dtype)
    k, v = checkpoint_name(k, "key_proj"), checkpoint_name(kvu[..., N:], "value_proj")
    width = max(N + R, V)  # one head width for every kernel: pad the narrower side with zeros
    if width > N + R:  # (zero features add nothing to q.k; the query keeps its 1/sqrt(N + R))
      q = q * jnp.asarray((width / (N + R)) ** 0.5, q.dtype)
      q, k = (jnp.pad(a, ((0, 0),) * 3 + ((0, width - N - R),)) for a in (q, k))
    v = jnp.pad(v, ((0, 0),) * 3 + ((0, width - V),))
    out = self.core(q, k, v, mask, pattern.causal, positions, bias)[..., :V]
    return self.project_out(out, rules)

  def core(self, q, k, v, mask, causal, positions, bias):
    """The expanded form through the configured attention implementation (and the context
    axis), sowing the largest score at evaluation."""
    c = self.cfg
    dropout_fn = None
    if c.attention_dropout > 0 and not self.deterministic:
      dropout_fn = nn.Dropout(c.attention_dropout, deterministic=False)
    blocks = (c.attention_block_q, c.attention_block_kv)
    core, logit_max = attend, max_attention_logit
    if context_size() > 1:  # the tokens split over mesh.context: modules/context.py
      core, logit_max = split_attention(
          attend, max_attention_logit, positions, c.context_strategy, blocks
      )
    if self.is_mutable_collection("intermediates"):
      self.sow(
          "intermediates",
          "attention_logit_max",
          logit_max(q, k, mask, causal, None, bias=bias, cap=c.attention_softcap),
      )
    return core(
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

  def project_out(self, out, rules):
    c = self.cfg
    out = checkpoint_name(out, "context")
    w = DenseWeights(
        c,
        (c.d_model,),
        ("heads", "head_dim", "embed"),
        ("embed",),
        rule=rules.get("out"),
        name="out",
    )
    return checkpoint_name(apply_projection(out, w((c.num_heads, c.v_head_dim)), 2), "out_proj")


MLA_FIELDS = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of a multi-head latent attention setting that cannot work, or None."""
  for field in ("kv_lora_rank",) + MLA_FIELDS:
    if getattr(c, field) < 0:
      return field, str(getattr(c, field)), "must be >= 0"
  if not c.mla:
    for field in MLA_FIELDS:
      if getattr(c, field):
        fix = "only multi-head latent attention reads it: set model.kv_lora_rank or leave it 0"
        return field, str(getattr(c, field)), fix
    return None
  if c.qk_nope_head_dim + c.qk_rope_head_dim < 1:
    return "qk_nope_head_dim", "0", "queries and keys need a width: set it (DeepSeek-V3: 128)"
  if c.v_head_dim < 1:
    return "v_head_dim", str(c.v_head_dim), "must be positive (DeepSeek-V3: 128)"
  if c.positions == "rope" and c.qk_rope_head_dim < 1:
    return "qk_rope_head_dim", "0", "RoPE rotates the decoupled key: give it a width (64)"
  if c.positions != "rope" and c.qk_rope_head_dim:
    fix = f"only RoPE rotates a decoupled key, and model.positions={c.positions!r}: set it 0"
    return "qk_rope_head_dim", str(c.qk_rope_head_dim), fix
  if c.num_kv_heads is not None and c.num_kv_heads != c.num_heads:
    fix = "multi-head latent attention expands keys and values for every head: leave it unset"
    return "num_kv_heads", str(c.num_kv_heads), fix
  period = layer_types.pattern(c)
  if any(t.attention == "chunked" or t.rope not in ("global", "local") for t in period):
    fix = "multi-head latent attention takes full and sliding layers: use those in layer_types"
    return "layer_types", repr(c.layer_types), fix
  if c.rope_local_theta:
    fix = "multi-head latent attention rotates every layer at rope_theta: leave it 0"
    return "rope_local_theta", str(c.rope_local_theta), fix
  for field, default in (
      ("qk_norm", False),
      ("qkv_bias", None),
      ("value_residual", False),
      ("attention_sinks", False),
  ):
    if getattr(c, field) != default:
      fix = f"multi-head latent attention has no such option: leave it {default}"
      return field, repr(getattr(c, field)), fix
  features = set(PLACEMENTS[c.norm_placement].features) & {QKV_NORM, HEAD_GAIN, ATTENTION_OUT_NORM}
  if features:
    fix = f"its {sorted(features)[0]} has no place in multi-head latent attention: use pre"
    return "norm_placement", repr(c.norm_placement), fix
  if lora.projections(c) & {"query", "key", "value", "out"}:
    fix = "multi-head latent attention takes no adapters: target mlp_in, mlp_out only"
    return "lora_targets", repr(c.lora_targets), fix
  return None
