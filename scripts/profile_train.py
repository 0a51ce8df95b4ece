"""Where a training step's time goes, by timing its parts separately under jit.

    python scripts/profile_train.py [--config experiments/gpt2.py:tiny --config.model.d_model=256 ...]

Defaults to the issue's reference model: d_model 256, 4 layers, 4 heads, sequence 256, batch 16,
byte vocabulary. Parts: the whole step; forward+backward; forward; the optimizer update; and,
each timed forward+backward on its own inputs, one block's attention core (softmax(qk)v), its
projections and feed-forward, its norms, and the unembedding + cross-entropy. Prints JSON with
seconds per part and each part's share of the step (parts are timed alone, so shares need not
add up to 100%: XLA fuses across them inside the step).
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformers_jax import cli, parallel
from transformers_jax.models import build_model
from transformers_jax.modules.attention import attend
from transformers_jax.modules.norms import Norm
from transformers_jax.train import optim
from transformers_jax.train.compile import build_step
from transformers_jax.train.step import create_state
from transformers_jax.train.tasks import cross_entropy

cli.define_config_flag("experiments/gpt2.py:tiny")
flags.DEFINE_integer("repeats", 10, "Timed calls per part.")
FLAGS = flags.FLAGS

REFERENCE = dict(d_model=256, num_layers=4, num_heads=4, max_len=256)


def timed(f, *args, repeats):
  jax.block_until_ready(f(*args))
  t = time.perf_counter()
  for _ in range(repeats):
    out = f(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - t) / repeats


def main(argv):
  config = FLAGS.config
  if flags.FLAGS["config"].config_filename == "experiments/gpt2.py:tiny" and \
      config.model.d_model == 64:
    config.model.update(REFERENCE)
    config.seq_len, config.batch_size = 256, 16
  n = FLAGS.repeats
  step, _, _, c, mesh, task = build_step(config)
  tx = optim.make_optimizer(config)
  state, _ = create_state(c, tx, mesh, parallel.rules(), config.seed)
  B, T, D, V = config.batch_size, config.seq_len, c.d_model, c.vocab_size
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, V, (B, T + 1)), jnp.int32)
  model = build_model(c)

  def loss(p):
    logits = model.apply({"params": p}, tokens[:, :-1])["logits"]
    return cross_entropy(logits, tokens[:, 1:], jnp.ones((B, T)))["loss"]

  parts = {}
  batch = parallel.put_batch({"tokens": np.asarray(tokens)}, mesh)
  state, _ = step(state, batch)
  t = time.perf_counter()
  for _ in range(n):
    state, m = step(state, batch)
  jax.block_until_ready(m)
  parts["step"] = (time.perf_counter() - t) / n
  params = state.params  # the step donates its input state: take the live one
  grad = jax.jit(jax.grad(loss))
  parts["forward_backward"] = timed(grad, params, repeats=n)
  parts["forward"] = timed(jax.jit(loss), params, repeats=n)
  grads = grad(params)
  update = jax.jit(lambda g, o, p: tx.update(g, o, p))
  parts["optimizer_update"] = timed(update, grads, state.opt_state, params, repeats=n)

  H, K = c.num_heads, c.head_width
  q = jnp.asarray(rng.standard_normal((B, T, H, K)), jnp.float32)
  core = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v, None, True))
                          , argnums=(0, 1, 2)))
  parts["attention_core_all_layers"] = c.num_layers * timed(core, q, q, q, repeats=n)
  x = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
  w_attn = jnp.asarray(rng.standard_normal((D, 4 * D)) * 0.02, jnp.float32)
  w1 = jnp.asarray(rng.standard_normal((D, c.ff_width)) * 0.02, jnp.float32)
  w2 = jnp.asarray(rng.standard_normal((c.ff_width, D)) * 0.02, jnp.float32)

  def dense_part(x, wa, w1, w2):
    h = x @ wa  # q, k, v and output projections: 4 D x D matmuls
    f = jax.nn.gelu(x @ w1, approximate=True) @ w2
    return jnp.sum(h) + jnp.sum(f)

  dense_grad = jax.jit(jax.grad(dense_part, argnums=(0, 1, 2, 3)))
  parts["projections_and_ffn_all_layers"] = c.num_layers * timed(dense_grad, x, w_attn, w1, w2,
                                                                 repeats=n)
  norm = Norm(c)
  norm_params = norm.init(jax.random.PRNGKey(0), x)
  norm_grad = jax.jit(jax.grad(lambda p, x: jnp.sum(norm.apply(p, x) ** 2), argnums=(0, 1)))
  parts["norms_all_layers"] = (2 * c.num_layers + 1) * timed(norm_grad, norm_params, x,
                                                             repeats=n)
  emb = jnp.asarray(rng.standard_normal((V, D)) * 0.02, jnp.float32)
  head = jax.jit(jax.grad(lambda e, x: cross_entropy(x @ e.T, tokens[:, 1:],
                                                     jnp.ones((B, T)))["loss"], argnums=(0, 1)))
  parts["unembedding_cross_entropy"] = timed(head, emb, x, repeats=n)
  result = {"model": {"d_model": D, "layers": c.num_layers, "heads": H, "seq_len": T,
                      "batch_size": B, "vocab": V},
            "seconds": parts,
            "share_of_step": {k: v / parts["step"] for k, v in parts.items() if k != "step"}}
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  cli.run(main)
