"""The expert FFN of a device's sorted rows run in consecutive chunks (moe_ragged.chunked_ffn,
what keeps Mixtral 8x7B's 294,912 rows per chip from holding 16 GiB of hidden activations at
once) equals the whole in value and gradient."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformers_jax.config import ModelConfig
from transformers_jax.modules import moe_ragged


def test_row_chunks_keep_the_hidden_activations_under_the_limit():
  mixtral = ModelConfig(d_model=4096, d_ff=14336, activation="swiglu", feed_forward="moe")
  assert moe_ragged.row_chunks(mixtral, 294_912, jnp.bfloat16) == 8  # 15.8 GiB over 2 GiB
  assert moe_ragged.row_chunks(mixtral, 1024, jnp.bfloat16) == 1


def test_chunked_rows_equal_the_whole_in_value_and_gradient():
  """Groups that straddle the chunk boundaries, an empty group, dropped rows at the end."""
  rng = np.random.default_rng(0)
  e, d, f, m = 4, 8, 16, 300
  group_sizes = jnp.asarray([120, 0, 97, 61], jnp.int32)  # 278 kept, 22 rows past the groups
  xs = jnp.asarray(rng.standard_normal((m, d)), jnp.float32)
  xs = jnp.where((jnp.arange(m) < 278)[:, None], xs, 0)
  weights = {
      "wi": jnp.asarray(rng.standard_normal((e, d, f)) / 3, jnp.float32),
      "wi_1": jnp.asarray(rng.standard_normal((e, d, f)) / 3, jnp.float32),
      "wo": jnp.asarray(rng.standard_normal((e, f, d)) / 4, jnp.float32),
  }
  ffn = functools.partial(moe_ragged.grouped_ffn_blocked, act=jax.nn.silu, gated=True)

  def loss(xs, weights, chunks):
    out = moe_ragged.chunked_ffn(lambda r, s, w: ffn(r, s, w), xs, group_sizes, weights, chunks)
    return jnp.sum(jnp.sin(out)), out

  # one program per chunk count, not one compilation per operation
  grad = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True), static_argnums=2)
  (whole, out1), grads1 = grad(xs, weights, 1)
  (parts, out3), grads3 = grad(xs, weights, 3)
  assert out3.shape == out1.shape
  np.testing.assert_allclose(out3, out1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(parts, whole, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grads3), jax.tree_util.tree_leaves(grads1)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(out3)[278:] == 0)
