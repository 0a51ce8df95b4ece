"""config.loss_chunks: the language-model loss made a chunk of tokens at a time (tasks/base.py,
chunked_cross_entropy) equals the whole computation in value and gradient, over training
steps, and holds less memory (XLA's own figures for the compiled gradient)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import initializer
from transformers_jax.tasks import task_for
from transformers_jax.train.step import make_loss_fn

B, T, V = 4, 64, 4000


def sgd_run(cfg, chunks, steps=5):
  """(losses of `steps` SGD steps, the last gradient, temporaries of the compiled gradient):
  with label smoothing and z-loss, the gradient of every parameter."""
  params = nn.unbox(jax.jit(initializer(cfg))(jax.random.PRNGKey(0)))
  options = {"label_smoothing": 0.1, **({"loss_chunks": chunks} if chunks > 1 else {})}
  loss_fn = make_loss_fn(task_for(cfg), cfg, options, 0.0, z_loss=1e-4)
  batch = {"tokens": jax.random.randint(jax.random.PRNGKey(1), (B, T + 1), 0, V)}
  grad = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, jax.random.PRNGKey(2))[0]))
  temp = grad.lower(params).compile().memory_analysis().temp_size_in_bytes
  losses = []
  for _ in range(steps):
    loss, g = grad(params)
    losses.append(float(loss))
    params = jax.tree_util.tree_map(lambda p, d: p - 1e-3 * d, params, g)
  return losses, g, temp


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_chunked_loss_equals_the_whole_and_holds_less(tied):
  cfg = ModelConfig(
      family="decoder",
      num_layers=1,
      d_model=32,
      num_heads=2,
      vocab_size=V,
      vocab_multiple=128,  # padded rows stay masked in every chunk
      max_len=T,
      tie_embeddings=tied,
  )
  whole_losses, whole_grad, whole_temp = sgd_run(cfg, 1)
  losses, grad, temp = sgd_run(cfg, 8)
  np.testing.assert_allclose(losses, whole_losses, rtol=1e-5)
  # (relative to the largest gradient: the key bias's is zero in exact arithmetic, rounding noise)
  scale = max(float(jnp.max(jnp.abs(b))) for b in jax.tree_util.tree_leaves(whole_grad))
  for a, b in zip(jax.tree_util.tree_leaves(grad), jax.tree_util.tree_leaves(whole_grad)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale)
  logits_bytes = B * T * cfg.padded_vocab * 4
  # the whole loss keeps the [B, T, V] logits and their gradient; the chunks 1/8 of them
  assert whole_temp - temp > logits_bytes, (whole_temp, temp, logits_bytes)


def test_loss_chunks_is_refused_where_it_cannot_apply():
  from transformers_jax.train_config import training_fields

  lm = ModelConfig(family="decoder", max_len=T, vocab_size=256)
  config = training_fields()
  config.model = ml_collections.ConfigDict(lm.to_dict())
  config.seq_len = 64
  config.loss_chunks = 3
  with pytest.raises(ValueError, match="loss_chunks=3: a divisor of seq_len=64"):
    task_for(lm).check(config, lm)
  config.loss_chunks = 4
  task_for(lm).check(config, lm)
  bert = ModelConfig(family="encoder", head="mlm", max_len=T, vocab_size=256)
  with pytest.raises(ValueError, match="computes its logits whole"):
    task_for(bert).check(config, bert)


def test_chunks_split_over_context_keep_every_device_on_its_own_tokens():
  """With the tokens split over a context axis of 8 TPU chips (compiled deviceless for
  v5p:2x2x2), each chunk is every 4th token, so every chip makes the logits of its own 1/8 of a
  chunk: its temporaries stay below one chunk's whole logits, which a chunk of consecutive
  tokens (living on 2 of the 8 chips) would have handed to all of them."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from transformers_jax.machine import hardware
  from transformers_jax.tasks.base import chunked_cross_entropy

  devices = hardware.topology_devices("v5p:2x2x2")
  mesh = jax.sharding.Mesh(np.array(devices), ("context",))
  length, width, vocab, chunks = 8192, 128, 4096, 4
  cfg = ModelConfig(family="decoder", vocab_size=vocab, max_len=length, d_model=width)

  def loss(hidden, unembedding, targets, weights):
    sums = chunked_cross_entropy(hidden, unembedding, cfg, targets, weights, chunks, 0.0, None, 0.0)
    return sums["loss"]

  tokens = NamedSharding(mesh, P(None, "context"))
  args = (
      jax.ShapeDtypeStruct((1, length, width), jnp.float32, sharding=tokens),
      jax.ShapeDtypeStruct((width, vocab), jnp.float32, sharding=NamedSharding(mesh, P())),
      jax.ShapeDtypeStruct((1, length), jnp.int32, sharding=tokens),
      jax.ShapeDtypeStruct((1, length), jnp.float32, sharding=tokens),
  )
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()
  chunk_logits = length // chunks * vocab * 4
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp < chunk_logits / 2, (temp, chunk_logits)
