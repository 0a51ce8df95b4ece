"""nGPT, the normalised Transformer (Loshchilov et al. 2024, "nGPT: Normalized Transformer with
Representation Learning on the Hypersphere", arXiv 2410.01131): hidden states and every weight
vector along d_model on the unit sphere. Notation: the package's docstring
(modules/placements/__init__.py); Norm(x) = x / ||x||_2 over the last axis (no parameters).

The paper's scaling vectors are stored in its "init / scale" form: a vector s with initial
value s_init and scale s_scale is a parameter that starts at s_scale and is read as
param * (s_init / s_scale) (`scaled_gain`), so Adam's steps move it s_init / s_scale times
faster than a plain parameter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.modules.placement_base import (
    FFN_SCALES,
    LOGIT_GAIN,
    QK_SPHERE,
    Placement,
)

# (s_init, s_scale) of each scaling vector (the paper's Table and its code); "d" stands for
# d_model^-1/2, the paper's base scale
EIGEN_LR = (0.05, "d")  # alpha_A, alpha_M: the eigen learning rates, one per dimension
QK_SCALE = (1.0, "d")  # s_qk, one per head and width
FFN_SCALE = (1.0, 1.0)  # s_u and s_v, one per hidden unit
LOGIT_SCALE = (1.0, "d")  # s_z, one per vocabulary entry


def unit(x, axis: int = -1):
  """x / ||x||_2 along `axis` (float32 inside, x's dtype out)."""
  xf = x.astype(jnp.float32)
  norm_sq = jnp.maximum(jnp.sum(jnp.square(xf), axis=axis, keepdims=True), 1e-30)
  return (xf * jax.lax.rsqrt(norm_sq)).astype(x.dtype)


def init_and_scale(cfg, entry) -> tuple[float, float]:
  return tuple(cfg.d_model**-0.5 if v == "d" else v for v in entry)


def scaled_gain(module: nn.Module, cfg, name: str, shape, entry, names):
  """The scaling vector `name` of `module` as the model reads it: param * (s_init / s_scale),
  the parameter initialised to s_scale; `entry` is one of the (s_init, s_scale) above."""
  init, scale = init_and_scale(cfg, entry)
  initializer = nn.with_logical_partitioning(nn.initializers.constant(scale), names)
  return module.param(name, initializer, shape, jnp.dtype(cfg.param_dtype)) * (init / scale)


def sphere_query(module: nn.Module, cfg, q):
  """Queries [B, T, H, K] already on the unit sphere (after any rotation), multiplied by
  s_qk^2 (`qk_scale_gain` [H, K]) and by K: the attention core divides q.k by sqrt(K), so the
  scores are sqrt(K) (s_qk q) . (s_qk k), the paper's softmax scale sqrt(d_k) on queries and
  keys both scaled by s_qk. (Scaling the queries twice and the keys never gives the same
  scores, and lets the key cache and grouped key/value heads hold the unit keys.)"""
  heads, width = q.shape[-2:]
  s = scaled_gain(module, cfg, "qk_scale_gain", (heads, width), QK_SCALE, ("heads", "head_dim"))
  return q * (jnp.square(s) * width).astype(q.dtype)


def logit_scale(cfg, param):
  """s_z as the model reads it, from its stored parameter (models/common.py's LogitGain)."""
  init, scale = init_and_scale(cfg, LOGIT_SCALE)
  return param * (init / scale)


# The weights the constraint renormalises: (module name, parameter name) -> which of the
# weight's own axes is its d_model-sized one, "first" (the input side of a kernel [D, ...]) or
# "last" (an embedding table's rows [..., D], an output projection [..., D]).
UNIT_AXES = {
    ("token_embed", "embedding"): "last",
    ("pos_embed", "embedding"): "last",
    ("type_embed", "embedding"): "last",
    ("patch_embed", "kernel"): "last",
    ("query", "kernel"): "first",
    ("key", "kernel"): "first",
    ("value", "kernel"): "first",
    ("out", "kernel"): "last",
    ("wi", "kernel"): "first",
    ("wi_0", "kernel"): "first",
    ("wi_1", "kernel"): "first",
    ("wo", "kernel"): "last",
    ("lm_head", "kernel"): "first",
    ("mlm_decoder", "kernel"): "first",
}


def unit_weights(params):
  """nGPT's constraint: every weight of UNIT_AXES with its vectors along d_model set to unit
  L2 norm (a scanned stack's weights have their `layers` axis first). The heads other than the
  unembedding (pooler, classifier, MLM transform) and every bias and gain are left alone."""

  def one(path, leaf):
    names = tuple(str(getattr(key, "key", key)) for key in path)
    side = UNIT_AXES.get(names[-2:])
    if side is None:
      return leaf
    return unit(leaf, -1 if side == "last" else int("layers" in names))

  return jax.tree_util.tree_map_with_path(one, params)


class NGPT(Placement):
  """nGPT (Loshchilov et al. 2024). Every block puts its input on the sphere (a no-op after the
  first block; it places the embeddings there when positions or patches are added to them),
  then for each sublayer f (attention, then the MLP):

    h_f <- Norm(f(h))
    h   <- Norm(h + alpha_f (h_f - h))          alpha_f in R^D (`<sublayer>_eigen_gain`)

  alpha_f, the eigen learning rates, start at 0.05 with scale d^-1/2. Inside the sublayers
  (features QK_SPHERE, FFN_SCALES, LOGIT_GAIN):
    attention  q <- Norm(q) s_qk, k <- Norm(k) s_qk per head after RoPE, scores
               sqrt(d_k) q.k (s_qk init 1, scale d^-1/2; `sphere_query`)
    MLP        u <- u s_u, v <- v s_v sqrt(D), out = W_o (u * SiLU(v)) (s_u, s_v init 1, scale
               1: `up_gain`, `gate_gain`); a non-gated activation reads act(s_v sqrt(D) x W_i)
    logits     z <- s_z z (init 1, scale d^-1/2: `logit_gain`)
  No norms (model.norm is unused, no final norm). After every optimizer step the update body
  applies `unit_weights` (`constraint`): token, position and type embeddings' rows, q, k, v,
  the FFN's input projections and the untied unembedding along their input axis, the attention
  and FFN output projections along their output axis, all of unit norm; the initial
  parameters too. The paper trains with no weight decay and no warmup (AdamW): set
  weight_decay=0 and warmup_steps=0 to follow it (the defaults are unchanged). Also the paper's:
  no biases (model.use_bias=False), RoPE, SwiGLU, an untied unembedding; left to the config.
  The authors' code takes |alpha| and scales u by sqrt(D) as well; this follows the paper's
  equations."""

  uses_norms = False
  features = (QK_SPHERE, FFN_SCALES, LOGIT_GAIN)
  paper_init = "gpt2"
  paper_init_source = (
      "Loshchilov et al. 2024's code: N(0, d^-1/2) weights, then each normalised (any isotropic "
      "normal gives the same directions: gpt2's)"
  )

  def block(self, site, x, sublayers):
    d = site.cfg.d_model
    init, scale = init_and_scale(site.cfg, EIGEN_LR)
    h = unit(x)
    for name, fn in sublayers:
      alpha = site.gain(f"{name}_eigen_gain", (d,), scale) * (init / scale)
      h_f = unit(site.dropout(fn(h)))
      h = unit(h + alpha.astype(h.dtype) * (h_f - h))
    return h

  def constraint(self, cfg):
    del cfg
    return unit_weights

  def config_problem(self, cfg):
    refused = {
        "residual": (False, "nGPT's updates are residual by construction: keep True"),
        "feed_forward": ("moe", "nGPT's MLP scales are built for the dense feed-forward only"),
        "qk_norm": (True, "nGPT puts queries and keys on the unit sphere itself: set False"),
        "scale_scores": (False, "nGPT scales the scores by sqrt(head_dim) itself: keep True"),
    }
    for field, (value, fix) in refused.items():
      if getattr(cfg, field) == value:
        return field, repr(value), fix
    if cfg.score_scale_width:
      return "score_scale_width", str(cfg.score_scale_width), "nGPT's scale is sqrt(head_dim)"
    if cfg.lora_rank:
      why = "LoRA's adapters change the weights outside nGPT's unit-norm constraint: set 0"
      return "lora_rank", str(cfg.lora_rank), why
    return None
