"""Placements that widen the residual stream into n copies mixed by learned connections:
Hyper-Connections and DeepSeek's manifold-constrained hyper-connections (mHC). Notation: the
package's docstring (modules/placements/__init__.py); H [n, D] is the n streams of one token
(`model.residual_streams`), T a sublayer with its pre-LN norm, T(h) = f(N(h)).

The stack copies its input n times before the first block (`Placement.enter`) and sums the n
streams after the last (`Placement.leave`), before the final norm and the head; under nn.scan
the carry is [B, T, n, D] throughout. Each sublayer (self-attention, cross-attention,
feed-forward) is one "layer" of the papers, with its own connections; the k-th sublayer of a
stack (k = l S + j for sublayer j of the S in block l) has its static input connection at
stream k mod n.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from transformers_jax.modules.placement_base import Placement

# the learned factors of the dynamic terms start small (Zhu et al. 2024, their code: 0.01)
DYNAMIC_SCALE_INIT = 0.01
# mHC's Sinkhorn-Knopp iterations t_max (Xie et al. 2025: 20)
SINKHORN_ITERATIONS = 20


def sinkhorn(logits, iterations: int = SINKHORN_ITERATIONS):
  """Sinkhorn-Knopp over the last two axes: M(0) = exp(logits), then `iterations` times
  M(t) = T_r(T_c(M(t-1))), T_c dividing each column by its sum and T_r each row by its own
  (float32; the largest logit is subtracted first, which leaves the result unchanged)."""
  logits = logits.astype(jnp.float32)
  m = jnp.exp(logits - logits.max((-2, -1), keepdims=True))

  def step(_, m):
    m = m / m.sum(-2, keepdims=True)
    return m / m.sum(-1, keepdims=True)

  return jax.lax.fori_loop(0, iterations, step, m)


class HyperConnections(Placement):
  """Hyper-Connections (Zhu et al. 2024, arXiv 2409.19606), expansion rate n. Per sublayer, a
  matrix A [n, n+1] whose column 0 is A_m (width connection into the sublayer) and whose
  columns 1..n are A_r (the streams among themselves), and B [n] (the depth connection):

    (h_0; H') = A^T H            h_0 = sum_i A_m[i] h_i,  h'_j = sum_i A_r[i, j] h_i
    H <- B^T T(h_0) + H'          stream j: B[j] T(h_0) + h'_j

  Static (the paper's initialisation, equal to pre-LN when the streams are copies): for the
  k-th sublayer A_m = e_{k mod n}, A_r = I_n, B = 1. Dynamic (`model.hyper_dynamic`), with
  H_bar = N_hc(H) (a norm of the config's kind per stream):

    A(H) = A + s_a tanh(H_bar W_a)      W_a [D, n+1]
    B(H) = B + s_b tanh(H_bar W_b)^T    W_b [D]

  W_a and W_b start at 0 and s_a, s_b at 0.01 (the paper's code), so a dynamic model starts
  as the static one. Parameters: `<sublayer>_hc_alpha_gain` (A), `_hc_beta_gain` (B), and
  dynamic `_hc_alpha_fn_gain`, `_hc_beta_fn_gain`, `_hc_alpha_scale_gain`,
  `_hc_beta_scale_gain`, `_hc_norm` (all counted in `gains` but the norm)."""

  final_norm = True
  reads = ("residual_streams", "hyper_dynamic")
  paper_init = "gpt2"
  paper_init_source = "Zhu et al. 2024 trained OLMo and OLMoE models; OLMoE's init is N(0, 0.02)"

  def streams(self, cfg) -> int:
    return cfg.residual_streams

  def config_problem(self, cfg):
    if not cfg.residual:
      fix = f"norm_placement={cfg.norm_placement} has its own residual connections: keep True"
      return "residual", "False", fix
    return None

  def block(self, site, x, sublayers):
    for j, (name, fn) in enumerate(sublayers):
      x = self.connect(site, x, name, fn, site.depth.layer * len(sublayers) + j)
    return x

  def connect(self, site, h, name, fn, k):
    """One sublayer's connections around T: h [..., n, D] -> [..., n, D]; `k` the sublayer's
    index in its stack (a traced scalar under nn.scan)."""
    c, f32 = site.cfg, jnp.float32
    n, d = h.shape[-2:]
    init = jnp.concatenate([jax.nn.one_hot(k % n, n)[:, None], jnp.eye(n)], axis=1)
    alpha = site.gain(f"{name}_hc_alpha_gain", (n, n + 1), init).astype(f32)
    beta = site.gain(f"{name}_hc_beta_gain", (n,), 1.0).astype(f32)
    if c.hyper_dynamic:
      normed = site.norm(f"{name}_hc_norm")(h).astype(f32)
      w_alpha = site.gain(f"{name}_hc_alpha_fn_gain", (d, n + 1), 0.0).astype(f32)
      w_beta = site.gain(f"{name}_hc_beta_fn_gain", (d,), 0.0).astype(f32)
      s_alpha = site.gain(f"{name}_hc_alpha_scale_gain", (), DYNAMIC_SCALE_INIT).astype(f32)
      s_beta = site.gain(f"{name}_hc_beta_scale_gain", (), DYNAMIC_SCALE_INIT).astype(f32)
      alpha = alpha + s_alpha * jnp.tanh(normed @ w_alpha)  # [..., n, n+1]
      beta = beta + s_beta * jnp.tanh(normed @ w_beta)  # [..., n]
    mixed = jnp.einsum("...ij,...id->...jd", alpha.astype(h.dtype), h)  # A^T H [..., n+1, D]
    y = site.dropout(fn(site.norm(f"{name}_norm")(mixed[..., 0, :])))
    return beta.astype(h.dtype)[..., :, None] * y[..., None, :] + mixed[..., 1:, :]


class ManifoldHyperConnections(HyperConnections):
  """mHC (Xie et al. 2025, "mHC: Manifold-Constrained Hyper-Connections", arXiv 2512.24880):
  hyper-connections whose stream mixing is doubly stochastic. Per sublayer, with x [n, D] the
  token's streams and x' = RMS(vec(x)) (the nD-vector divided by its RMS; the paper's RMSNorm
  gain is left out, as its kernels fold it into phi):

    H~pre  = a_pre  (x' phi_pre)  + b_pre         phi_pre, phi_post [nD, n]
    H~post = a_post (x' phi_post) + b_post        phi_res [nD, n^2], b_res [n, n]
    H~res  = a_res mat(x' phi_res) + b_res
    H_pre = sigmoid(H~pre), H_post = 2 sigmoid(H~post), H_res = Sinkhorn-Knopp(H~res)
    x <- H_res x + H_post^T T(H_pre x)

  Sinkhorn-Knopp: M(0) = exp(H~res), then t_max = 20 times a column and a row normalisation
  (`sinkhorn`): H_res's rows sum to 1, its columns within 1e-5 while the logits stay a few
  units apart (as they start; far wider ones converge more slowly). Followed from the paper: these equations,
  the non-negative pre/post maps, t_max = 20, n = 4. Not stated there, chosen so that, as HC's
  initialisation does, a block equals pre-LN at init while the streams are copies: phi = 0,
  a = 0.01 (HC's dynamic factors), b_pre = -log(n - 1) (H_pre = 1/n), b_post = 0
  (H_post = 1), b_res = 0 (H_res the uniform 1/n matrix). n >= 2. Parameters
  `<sublayer>_mhc_{pre,post,res}_{fn,scale,bias}_gain` (component `gains`)."""

  reads = ("residual_streams",)
  paper_init_source = (
      "Xie et al. 2025's models follow DeepSeek-V3, which draws every weight N(0, 0.006): one "
      "fixed std, gpt2's rule"
  )

  def config_problem(self, cfg):
    if cfg.residual_streams < 2:
      fix = "mhc needs n >= 2 streams (H_pre = 1/n at init): set 2 or more (the paper: 4)"
      return "residual_streams", str(cfg.residual_streams), fix
    return super().config_problem(cfg)

  def connect(self, site, h, name, fn, k):
    del k  # every sublayer starts alike: no stream is singled out
    c, f32 = site.cfg, jnp.float32
    n, d = h.shape[-2:]
    flat = h.reshape(*h.shape[:-2], n * d).astype(f32)
    x = flat * jax.lax.rsqrt(jnp.mean(jnp.square(flat), -1, keepdims=True) + c.norm_eps)
    maps = {}
    for part, shape, bias in (
        ("pre", (n,), -math.log(n - 1)),
        ("post", (n,), 0.0),
        ("res", (n, n), 0.0),
    ):
      phi = site.gain(f"{name}_mhc_{part}_fn_gain", (n * d, math.prod(shape)), 0.0).astype(f32)
      a = site.gain(f"{name}_mhc_{part}_scale_gain", (), DYNAMIC_SCALE_INIT).astype(f32)
      b = site.gain(f"{name}_mhc_{part}_bias_gain", shape, bias).astype(f32)
      maps[part] = a * (x @ phi).reshape(*x.shape[:-1], *shape) + b
    pre = jax.nn.sigmoid(maps["pre"]).astype(h.dtype)  # [..., n]
    post = 2 * jax.nn.sigmoid(maps["post"])  # [..., n]
    res = sinkhorn(maps["res"])  # [..., n, n]
    y = site.dropout(fn(site.norm(f"{name}_norm")(jnp.einsum("...i,...id->...d", pre, h))))
    mixed = jnp.einsum("...ij,...jd->...id", res.astype(h.dtype), h)
    return mixed + post.astype(h.dtype)[..., :, None] * y[..., None, :]
