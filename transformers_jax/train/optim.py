"""AdamW with warmup and a schedule, global-norm clipping and a weight-decay mask (optax)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from transformers_jax.train_config import SCHEDULES

DECAYED = ("kernel", "wi", "wi_1", "wo")  # matmul weights (dense kernels, MoE expert weights)


def schedule(config) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then the named decay over the remaining steps.

  rsqrt is the 2017 paper's d^-0.5 * min(step^-0.5, step * warmup^-1.5) with its peak set to
  `learning_rate`: lr * min(step / warmup, sqrt(warmup / step)).
  """
  peak, warmup, steps = config.learning_rate, config.warmup_steps, config.steps
  kind = config.lr_schedule
  if kind not in SCHEDULES:
    raise ValueError(f"lr_schedule={kind!r}: choose one of {', '.join(SCHEDULES)}")
  if kind == "rsqrt":
    w = max(warmup, 1)

    def rsqrt(step):
      s = jnp.asarray(step, jnp.float32)
      return peak * jnp.minimum(s / w, jnp.sqrt(w / jnp.maximum(s, 1.0)))

    return rsqrt
  decay_steps = max(steps - warmup, 1)
  after = {
      "cosine": optax.cosine_decay_schedule(peak, decay_steps, alpha=config.min_lr_ratio),
      "linear": optax.linear_schedule(peak, 0.0, decay_steps),
      "constant": optax.constant_schedule(peak),
  }[kind]
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def decay_mask(params, decay_embeddings: bool = False):
  """True for weights that get weight decay: matmul weights, and embeddings if asked.

  Biases, norm scales/biases, the class token and (by default) embedding tables are left alone.
  """

  def decide(path, _):
    name = jax.tree_util.keystr(path[-1:], simple=True)
    return name in DECAYED or (decay_embeddings and name == "embedding")

  return jax.tree_util.tree_map_with_path(decide, params)


def make_optimizer(config, learning_rate=None, weight_decay=None) -> optax.GradientTransformation:
  """The config's optimizer; `learning_rate` (a schedule) and `weight_decay` (a float or a
  traced scalar) replace the config's own when given (one member of a population)."""
  parts = []
  if config.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip))
  parts.append(
      optax.adamw(
          schedule(config) if learning_rate is None else learning_rate,
          b1=config.adam_b1,
          b2=config.adam_b2,
          eps=config.adam_eps,
          weight_decay=config.weight_decay if weight_decay is None else weight_decay,
          mask=lambda p: decay_mask(p, config.decay_embeddings),
      )
  )
  return optax.chain(*parts)
