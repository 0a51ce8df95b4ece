"""This project's train step against a minimal single-file JAX GPT of the same size, timed side by
side in one process on one device.

    python scripts/bench_jax_reference.py [--d_model 256 --layers 4 --heads 4 --seq_len 256
                                           --batch_size 16 --vocab 256 --rounds 10]
                                          [--config.model.vocab_multiple=1 ...]

The reference is the smallest honest GPT step in flax.linen: pre-LN blocks, one fused qkv matmul,
causal softmax attention over a full [T, T] mask, GELU (tanh) MLP, learned positions, tied
unembedding, optax's integer-label cross-entropy, AdamW with clipping; no sharding constraints,
no mesh, no metrics besides the loss. The project's step is `train.compile.build_step` on
experiments/gpt2.py:tiny with the same sizes. Steps alternate (reference, ours, reference, ...)
so a noisy host slows both alike; the median of `--rounds` steps each is reported, with their
ratio. `--config.*` overrides change one thing in the project's config (e.g.
`--config.model.attention_query_blocks=1`) to find what a difference costs; the size flags set
the config's sizes.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags
from flax import linen as nn

from transformers_jax import cli
from transformers_jax.errors import UserError
from transformers_jax.machine import parallel
from transformers_jax.train.compile import build_step

FLAGS = cli.ScriptFlags(__doc__)
cli.define_config_flag("experiments/gpt2.py:tiny", flag_values=FLAGS)
for _name, _default, _help in [
    ("d_model", 256, "Model width."),
    ("layers", 4, "Blocks."),
    ("heads", 4, "Attention heads."),
    ("seq_len", 256, "Tokens per sequence."),
    ("batch_size", 16, "Sequences per step."),
    ("vocab", 256, "Vocabulary size."),
    ("rounds", 10, "Timed steps of each model (the median is reported)."),
]:
  flags.DEFINE_integer(_name, _default, _help, lower_bound=1, flag_values=FLAGS)


class ReferenceBlock(nn.Module):
  heads: int

  @nn.compact
  def __call__(self, x):
    B, T, D = x.shape
    K = D // self.heads
    h = nn.LayerNorm(epsilon=1e-5)(x)
    q, k, v = jnp.split(nn.Dense(3 * D)(h).reshape(B, T, 3 * self.heads, K), 3, axis=2)
    scores = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(K)
    causal = jnp.tril(jnp.ones((T, T), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(scores.dtype).min), axis=-1)
    attended = jnp.einsum("bhts,bshk->bthk", weights, v).reshape(B, T, D)
    x = x + nn.Dense(D)(attended)
    h = nn.Dense(4 * D)(nn.LayerNorm(epsilon=1e-5)(x))
    return x + nn.Dense(D)(jax.nn.gelu(h, approximate=True))


class ReferenceGPT(nn.Module):
  vocab: int
  seq_len: int
  d_model: int
  layers: int
  heads: int

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(self.vocab, self.d_model)
    positions = self.param("positions", nn.initializers.normal(0.02), (self.seq_len, self.d_model))
    x = embed(tokens) + positions[: tokens.shape[1]]
    for _ in range(self.layers):
      x = ReferenceBlock(self.heads)(x)
    return embed.attend(nn.LayerNorm(epsilon=1e-5)(x))


def reference_step():
  model = ReferenceGPT(FLAGS.vocab, FLAGS.seq_len, FLAGS.d_model, FLAGS.layers, FLAGS.heads)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1))
  tokens = jnp.zeros((FLAGS.batch_size, FLAGS.seq_len + 1), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), tokens[:, :-1])["params"]
  opt_state = tx.init(params)

  def loss_fn(params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @jax.jit
  def step(state, tokens):
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  return step, (params, opt_state), tokens


def project_step():
  config = FLAGS.config
  with config.unlocked():
    config.model.update(
        d_model=FLAGS.d_model,
        num_layers=FLAGS.layers,
        num_heads=FLAGS.heads,
        vocab_size=FLAGS.vocab,
        max_len=FLAGS.seq_len,
    )
    config.update(seq_len=FLAGS.seq_len, batch_size=FLAGS.batch_size)
  setup = build_step(config)
  state = setup.init_state()
  batch = parallel.put_batch(setup.task.synthetic_batch(setup.model_cfg, config), setup.mesh)
  step = setup.train_step()
  return step, state, batch


def main(argv=None):
  if cli.parse_script_flags(FLAGS, argv):
    raise UserError("unexpected arguments: pass options as --flag=value")
  runs = {"reference": list(reference_step()), "project": list(project_step())}
  times = {name: [] for name in runs}
  for round_ in range(FLAGS.rounds + 2):  # two untimed rounds: compile, then warm up
    for name, run in runs.items():
      step, state, batch = run
      start = time.perf_counter()
      state, metrics = step(state, batch)
      jax.block_until_ready((state, metrics))
      run[1] = state
      if round_ >= 2:
        times[name].append(time.perf_counter() - start)
  medians = {name: float(np.median(t)) for name, t in times.items()}
  print(
      json.dumps(
          {
              "sizes": {
                  "d_model": FLAGS.d_model,
                  "layers": FLAGS.layers,
                  "heads": FLAGS.heads,
                  "seq_len": FLAGS.seq_len,
                  "batch_size": FLAGS.batch_size,
                  "vocab": FLAGS.vocab,
              },
              "overrides": [a for a in argv or [] if a.startswith("--config.")],
              "reference_step_s": medians["reference"],
              "project_step_s": medians["project"],
              "project_over_reference": medians["project"] / medians["reference"],
          }
      )
  )


if __name__ == "__main__":
  cli.run_script(main)
