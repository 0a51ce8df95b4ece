"""Position schemes (modules/positions/) as one object each: T5's relative bias and ALiBi as
score biases that every attention path takes (einsum, the fused call, flash per block with the
table's gradient, the KV cache, the context axis gathered or passed around a ring), their
formulas, their parameter counts, and what is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, counting
from transformers_jax.modules.attention import attend, max_attention_logit
from transformers_jax.modules.masks import AttentionMask
from transformers_jax.modules.positions import (
    POSITION_SCHEMES,
    ScoreBias,
    alibi_slopes,
    relative_bucket,
)

from conftest import assert_close, run_worker

KEY = jax.random.PRNGKey(0)


# ------------------------------------------------------------------ the formulas
def test_t5_buckets_are_exact_near_and_logarithmic_far():
  """32 buckets, max distance 128 (T5's defaults). Bidirectional: 16 per direction, 8 of them
  exact; keys after the query take the upper half. Causal: 16 exact, later keys share 0."""
  rel = jnp.array([0, -1, 1, -7, -8, -20, 20, -127, -128, -1000, 1000])
  got = relative_bucket(rel, True, 32, 128)
  # 20: 8 + int(log(20 / 8) / log(128 / 8) * 8) = 8 + 2; 127: 8 + int(7.98) = 15; beyond: 15
  np.testing.assert_array_equal(got, [0, 1, 17, 7, 8, 10, 26, 15, 15, 15, 31])
  rel = jnp.array([0, -1, 5, -15, -16, -40, -1000])
  # causal: 16 + int(log(40 / 16) / log(128 / 16) * 16) = 16 + 7
  np.testing.assert_array_equal(relative_bucket(rel, False, 32, 128), [0, 1, 0, 15, 16, 23, 31])


def test_alibi_slopes_follow_the_papers_geometric_sequence():
  np.testing.assert_allclose(alibi_slopes(8), [2.0**-i for i in range(1, 9)])
  # 12 heads: the 8-head slopes, then every other 16-head slope
  np.testing.assert_allclose(alibi_slopes(12)[8:], [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5])
  bias = ScoreBias(jnp.asarray(alibi_slopes(2)), "alibi")(jnp.array([[3]]), jnp.arange(5)[None])
  # 2 heads: slopes 2^-4 and 2^-8, times the distances |3 - j| = 3, 2, 1, 0, 1
  np.testing.assert_allclose(bias[0, :, 0], -np.outer([2**-4, 2**-8], [3, 2, 1, 0, 1]))


# ------------------------------------------------------------------ every path takes the bias
def qkv(T, H, G, K=16, B=2):
  keys = jax.random.split(KEY, 4)
  q = jax.random.normal(keys[0], (B, T, H, K))
  k, v = (jax.random.normal(kk, (B, T, G, K)) for kk in keys[1:3])
  return q, k, v, jax.random.normal(keys[3], (B, T, H, K))


# (kind, causal, heads, kv heads, mask): T = 100 is not a multiple of the 32-query blocks
BIAS_CASES = {
    "t5_bidirectional_padded_mqa": (
        "t5",
        False,
        4,
        1,
        AttentionMask(kv_valid=jnp.arange(100)[None] < jnp.array([[100], [70]])),
    ),
    "t5_causal_gqa": ("t5", True, 4, 2, None),
    "alibi_causal_packed": (
        "alibi",
        True,
        4,
        4,
        AttentionMask(q_segments=jnp.asarray(np.repeat([[1, 2]], [60, 40], axis=1).repeat(2, 0))),
    ),
}


def test_a_sliding_window_masks_keys_that_far_back_in_every_path():
  """Flash (blocks wholly outside the window skipped) and the fused call equal einsum, outputs
  and gradients, with packed segments, GQA and an ALiBi bias; einsum equals the written-out
  mask: key j visible to query i when 0 <= i - j < 20."""
  from transformers_jax.modules.masks import with_window

  q, k, v, cot = qkv(100, 4, 2)
  segments = jnp.asarray(np.repeat([[1, 2]], [60, 40], axis=1).repeat(2, 0))
  bias = ScoreBias(jnp.asarray(alibi_slopes(4)), "alibi", False)
  mask = with_window(AttentionMask(q_segments=segments), 20)

  def run(impl, mask=mask):
    def f(q, k, v):
      return attend(q, k, v, mask, True, impl=impl, block_q=32, block_kv=32, bias=bias)

    @jax.jit  # the forward and its VJP as one program
    def both(q, k, v, cot):
      out, vjp = jax.vjp(f, q, k, v)
      return (out, *vjp(cot))

    return both(q, k, v, cot)

  want = run("einsum")
  for impl in ("flash", "fused"):
    for a, b in zip(run(impl), want):
      assert_close(a, b)
  i = np.arange(100)
  allowed = (i[None] <= i[:, None]) & (i[:, None] - i[None] < 20)
  allowed &= np.asarray(segments[0])[:, None] == np.asarray(segments[0])[None]
  dense = jnp.asarray(allowed)[None, None]
  explicit = attend(q, k, v, dense, False, impl="einsum", bias=bias)
  assert_close(want[0], explicit)
  assert_close(
      max_attention_logit(q, k, mask, True, (32, 32), bias=bias),
      max_attention_logit(q, k, mask, True, bias=bias),
  )


def test_soft_capped_scores_through_flash_equal_einsum_and_the_written_out_formula():
  """Gemma 2's cap tanh(s / cap) on the scores (here at 2, with a window and GQA): flash's
  backward multiplies by 1 - tanh^2 block by block; outputs and gradients equal einsum's, and
  einsum equals the formula written out."""
  from transformers_jax.modules.masks import with_window

  q, k, v, cot = qkv(100, 4, 2)
  mask = with_window(None, 30)

  def run(impl):
    def f(q, k, v):
      return attend(q, k, v, mask, True, impl=impl, block_q=32, block_kv=32, softcap=2.0)

    @jax.jit  # the forward and its VJP as one program
    def both(q, k, v, cot):
      out, vjp = jax.vjp(f, q, k, v)
      return (out, *vjp(cot))

    return both(q, k, v, cot)

  want = run("einsum")
  for a, b in zip(run("flash"), want):
    assert_close(a, b)
  kk, vv = (jnp.repeat(x, 2, axis=2) for x in (k, v))
  s = 2.0 * jnp.tanh(jnp.einsum("bthk,bshk->bhts", q, kk) / 4.0 / 2.0)  # K = 16: sqrt 4
  i = np.arange(100)
  s = jnp.where((i[None] <= i[:, None]) & (i[:, None] - i[None] < 30), s, -1e30)
  written = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(s, -1), vv)
  assert_close(want[0], written)


@pytest.mark.parametrize("case", list(BIAS_CASES))
def test_flash_and_fused_with_a_score_bias_equal_einsum_with_gradients(case):
  """Outputs and the gradients of q, k, v and the bias's weights (T5's table) to 1e-5."""
  kind, causal, H, G, mask = BIAS_CASES[case]
  q, k, v, cot = qkv(100, H, G)
  weights = jax.random.normal(KEY, (32, H)) if kind == "t5" else jnp.asarray(alibi_slopes(H))

  def run(impl):
    def f(q, k, v, w):
      bias = ScoreBias(w, kind, not causal, 64)
      return attend(q, k, v, mask, causal, impl=impl, block_q=32, block_kv=32, bias=bias)

    @jax.jit  # the forward and its VJP as one program
    def both(q, k, v, weights, cot):
      out, vjp = jax.vjp(f, q, k, v, weights)
      return (out, *vjp(cot))

    return both(q, k, v, weights, cot)

  want = run("einsum")
  for impl in ("flash", "fused"):
    for a, b in zip(run(impl), want):
      assert_close(a, b)
  # the logit-growth metric counts the bias too, block by block as written out
  bias = ScoreBias(weights, kind, not causal, 64)
  assert_close(
      max_attention_logit(q, k, mask, causal, (32, 32), bias=bias),
      max_attention_logit(q, k, mask, causal, bias=bias),
  )


def test_flash_with_t5_bias_keeps_its_temporaries_linear_in_the_length():
  """XLA's figure for the compiled forward and backward: doubling T doubles flash's
  temporaries (blocks, never a T x T bias or score array), while einsum's quadruple."""

  def temps(impl, T):
    q = jax.ShapeDtypeStruct((1, T, 2, 16), jnp.float32)
    table = jax.ShapeDtypeStruct((32, 2), jnp.float32)

    def loss(q, table):
      bias = ScoreBias(table, "t5", False, 128)
      out = attend(q, q, q, None, True, impl=impl, block_q=128, block_kv=128, bias=bias)
      return jnp.sum(out)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(q, table).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  flash = [temps("flash", T) for T in (2048, 4096)]
  assert flash[1] <= 2.2 * flash[0], flash
  assert flash[1] < 2 * 4096**2 * 4 / 16, flash  # a 16th of one float32 [H, T, T] array
  einsum = [temps("einsum", T) for T in (2048, 4096)]
  assert einsum[1] >= 3.5 * einsum[0], einsum


# ------------------------------------------------------------------ models
SMALL = dict(num_layers=2, d_model=32, num_heads=4, vocab_size=50, max_len=24)


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder", "encoder"])
def test_t5_bias_is_one_table_per_stack_and_counts_match(family):
  c = ModelConfig(family=family, positions="t5", scan_layers=family == "decoder", **SMALL)
  params = nn.unbox(counting.param_shapes(c))
  tables = {k: v["relative_bias"].shape for k, v in params.items() if "relative_bias" in v}
  stacks = (
      ("encoder", "decoder")
      if family == "encoder_decoder"
      else (("decoder",) if family == "decoder" else ("encoder",))
  )
  assert tables == {s: (32, 4) for s in stacks}
  assert counting.count(c) == counting.analytic_count(c)
  assert counting.analytic_breakdown(c)["position_bias"] == 32 * 4 * len(stacks)
  # ALiBi adds no parameters and no position table
  alibi = ModelConfig(family=family, positions="alibi", **SMALL)
  assert counting.count(alibi) == counting.count(c) - 32 * 4 * len(stacks)


def test_relative_positions_make_scores_shift_invariant():
  """With T5 bias (no embedding of positions) a decoder's output for a token depends on offsets
  only: the same tokens at positions shifted by 5 give the same logits."""
  c = ModelConfig(family="decoder", positions="t5", **SMALL)
  model = build_model(c)
  tokens = jax.random.randint(KEY, (2, 12), 0, 50)
  params = jax.jit(model.init)(KEY, tokens)
  # one program per model for both position offsets (op by op, each operation compiles)
  logits = jax.jit(
      lambda m, params, p: m.apply(params, tokens, positions=p)["logits"], static_argnums=0
  )
  at = lambda p: logits(model, params, p)  # noqa: E731
  base = jnp.broadcast_to(jnp.arange(12), (2, 12))
  assert_close(at(base + 5), at(base))
  learned = ModelConfig(family="decoder", positions="learned", **SMALL)
  model = build_model(learned)
  params = jax.jit(model.init)(KEY, tokens)
  assert not np.allclose(at(base + 5), at(base), atol=1e-3)  # learned positions are absolute


def test_the_registry_names_every_scheme_and_splash_refuses_a_bias():
  """The choices validation takes are the registry's, and every scheme with a score bias (T5's
  and ALiBi among them) is refused with splash."""
  from transformers_jax.config import choices

  assert choices()["positions"] == tuple(POSITION_SCHEMES)
  biased = [name for name, scheme in POSITION_SCHEMES.items() if scheme.has_score_bias]
  assert {"t5", "alibi"} <= set(biased)
  for positions in biased:
    with pytest.raises(ValueError, match="model.attention_impl='splash'.*use flash"):
      ModelConfig(positions=positions, attention_impl="splash", attention_block_q=128)
  with pytest.raises(ValueError, match="model.relative_max_distance=8"):
    ModelConfig(positions="t5", relative_max_distance=8)
  with pytest.raises(ValueError, match="model.positions='t6'"):
    ModelConfig(positions="t6")


# ------------------------------------------------------------------ the context axis
@pytest.fixture(scope="module")
def context_runs():
  """One 8-device worker, 4 steps on the same batches of the 2017 Transformer with T5's
  relative bias (bidirectional buckets in the encoder, whose split keeps natural order; causal
  ones in the decoder, whose split is zig-zag permuted) and a sliding window of 5 positions in
  the decoder: whole sequences, and split over context 4 with the keys gathered and passed
  around a ring."""
  meshes = {
      "whole": {"data": 8},
      "gather4": {"fsdp": 2, "context": 4},
      "ring4": {"fsdp": 2, "context": 4, "model": {"context_strategy": "ring"}},
  }
  spec = {
      "runs": {"transformer": list(meshes)},
      "meshes": meshes,
      "steps": 4,
      "batch_size": 8,
      "model": {
          "positions": "t5",
          "sliding_window": 5,
          "attention_impl": "flash",
          "num_layers": 1,
      },
  }
  return run_worker("sharding_worker.py", spec, devices=8)


@pytest.mark.parametrize("strategy", ["gather4", "ring4"])
def test_t5_bias_over_context_4_equals_whole_sequences(context_runs, strategy):
  whole = context_runs["transformer/whole"]["losses"]
  assert whole[0] != whole[-1]  # it trains
  assert context_runs[f"transformer/{strategy}"]["losses"] == pytest.approx(whole, rel=1e-5)
