"""What a query may attend is data (modules/masks.py): a prefix LM's bidirectional prefix and
Llama 4's chunks, set in the mask, run the same in every attention implementation, in the
prefix_lm Task's training and in KV-cache decoding. The context axis (all-gather and ring)
runs the prefix pattern in tests/ring_worker.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax.config import ModelConfig
from transformers_jax.modules.attention import attend
from transformers_jax.modules.masks import AttentionMask

B, T, H, G, K = 2, 24, 4, 2, 8
PREFIX = np.array([5, 17], np.int32)  # row 1's prefix spans three key blocks of 8


def allowed(pattern: str) -> np.ndarray:
  """[B, T, T] True where query i may attend key j, written out from the pattern's rule."""
  i, j = np.arange(T)[:, None], np.arange(T)[None, :]
  if pattern == "prefix":
    return np.stack([(j <= i) | (j < p) for p in PREFIX])
  if pattern == "chunk":  # chunks of 6 positions, causal within each
    return np.broadcast_to((j <= i) & (i // 6 == j // 6), (B, T, T))
  raise ValueError(pattern)


def mask_of(pattern: str) -> AttentionMask:
  if pattern == "prefix":
    return AttentionMask(prefix=jnp.asarray(PREFIX), causal=True)
  return AttentionMask(chunk=6, causal=True)


def reference(q, k, v, ok):
  """softmax(q k / sqrt(K)) v over the allowed keys, in numpy (float64)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  k, v = np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2)
  s = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(K)
  s = np.where(ok[:, None], s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum("bhts,bshk->bthk", w, v)


@pytest.fixture(scope="module")
def qkv():
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  return (
      jax.random.normal(keys[0], (B, T, H, K)),
      jax.random.normal(keys[1], (B, T, G, K)),
      jax.random.normal(keys[2], (B, T, G, K)),
  )


@pytest.mark.parametrize("pattern", ["prefix", "chunk"])
def test_every_attention_implementation_runs_the_pattern_its_mask_carries(qkv, pattern):
  """einsum, fused (XLA's dot_product_attention), flash (blocks of 8: prefix blocks past the
  diagonal visited, other chunks' blocks skipped) and splash (which hands such masks to flash)
  against the rule written out; flash's gradients against einsum's. No `causal` argument is
  passed: the pattern is the mask's."""
  q, k, v = qkv
  mask, want = mask_of(pattern), reference(*qkv, allowed(pattern))
  for impl in ("einsum", "fused", "flash", "splash"):
    run = jax.jit(functools.partial(attend, causal=False, impl=impl, block_q=8, block_kv=8))
    np.testing.assert_allclose(run(q, k, v, mask), want, atol=2e-5, err_msg=impl)

  def loss(impl, q, k, v):
    return jnp.sum(jnp.sin(attend(q, k, v, mask, False, impl=impl, block_q=8, block_kv=8)))

  grads = {
      impl: jax.jit(jax.grad(functools.partial(loss, impl), argnums=(0, 1, 2)))(q, k, v)
      for impl in ("einsum", "flash")
  }
  for a, b in zip(grads["flash"], grads["einsum"]):
    np.testing.assert_allclose(a, b, atol=2e-5)


def _prefix_lm_setup():
  from transformers_jax.tasks import TASKS
  from transformers_jax.train_config import experiment_config

  task = TASKS["prefix_lm"]
  config = experiment_config(
      training=dict(batch_size=2, seq_len=16),
      # two blocks: with one, the continuation's positions see every prefix token either way,
      # so only a second block carries the prefix's bidirectional states into the loss
      num_layers=2,
      d_model=16,
      num_heads=2,
      max_len=32,
      vocab_size=64,
  )
  return task, config


def test_prefix_lm_trains_alike_under_every_attention_implementation():
  """The prefix_lm Task's loss and gradients with einsum, fused, flash and splash attention: a
  prefix is the batch's, the pattern the model's mask, so every path agrees with einsum."""
  from transformers_jax.models import build_model, initializer

  task, config = _prefix_lm_setup()
  batch = task.synthetic_batch(ModelConfig.from_dict(config.model), config)
  assert ((batch["prefix"] >= 1) & (batch["prefix"] < config.seq_len)).all()
  results = {}
  params = None
  for impl in ("einsum", "fused", "flash", "splash"):
    c = ModelConfig.from_dict({**config.model.to_dict(), "attention_impl": impl})
    params = params if params is not None else initializer(c)(jax.random.PRNGKey(0))
    model = build_model(c)

    def loss(p, model=model, c=c):
      outs, _ = task.outputs(model, {"params": p}, batch, {}, [])
      sums = task.loss(outs, batch, c, 0.0)
      return sums["loss"] / sums["weight"]

    results[impl] = jax.jit(jax.value_and_grad(loss))(params)
  for impl, (value, grads) in results.items():
    np.testing.assert_allclose(value, results["einsum"][0], rtol=1e-5, err_msg=impl)
    for a, b in zip(
        jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(results["einsum"][1])
    ):
      np.testing.assert_allclose(a, b, atol=2e-5, err_msg=impl)


def test_a_prefix_is_seen_both_ways_and_its_targets_are_not_trained():
  """Within the prefix an earlier position sees a later token; after it, no position sees a
  later one; the loss weights only the continuation."""
  from transformers_jax.models import build_model, initializer

  task, config = _prefix_lm_setup()
  c = ModelConfig.from_dict(config.model)
  model, params = build_model(c), initializer(c)(jax.random.PRNGKey(1))
  tokens = jax.random.randint(jax.random.PRNGKey(2), (1, 17), 0, 64)
  prefix = jnp.array([6], jnp.int32)
  logits = jax.jit(lambda t: model.apply({"params": params}, t, prefix_lengths=prefix)["logits"])
  base = logits(tokens[:, :-1])
  inside = logits(tokens[:, :-1].at[0, 4].set((tokens[0, 4] + 1) % 64))  # in the prefix
  after = logits(tokens[:, :-1].at[0, 10].set((tokens[0, 10] + 1) % 64))  # after it
  assert float(jnp.max(jnp.abs(inside[0, :4] - base[0, :4]))) > 1e-6  # seen from before it
  np.testing.assert_allclose(after[0, :10], base[0, :10], atol=1e-6)  # never seen from before
  outs, _ = task.outputs(model, {"params": params}, {"tokens": tokens, "prefix": prefix}, {}, [])
  np.testing.assert_array_equal(outs[2][0], (np.arange(16) + 1 >= 6).astype(np.float32))


def test_decoding_a_prefix_prompt_equals_the_whole_forward_pass():
  """generate(prompt_is_prefix=True): the prompt's tokens attend one another in the prefill
  (left-padded rows included), so the first new token's logits are those of the forward pass
  with that prefix."""
  from transformers_jax import decode
  from transformers_jax.models import build_model, initializer

  _, config = _prefix_lm_setup()
  c = ModelConfig.from_dict(config.model)
  params = initializer(c)(jax.random.PRNGKey(3))
  prompts = [[3, 9, 4, 22, 7], [5, 1, 30]]
  out = decode.generate(c, params, prompts, 2, return_logits=True, prompt_is_prefix=True)
  model = build_model(c)
  for row, prompt in enumerate(prompts):
    tokens = jnp.asarray([prompt])
    whole = model.apply(
        {"params": params}, tokens, prefix_lengths=jnp.array([len(prompt)], jnp.int32)
    )["logits"][0, -1]
    np.testing.assert_allclose(out.logits[row][0], whole, atol=2e-5)
