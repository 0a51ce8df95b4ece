"""AdamW with warmup and a schedule, global-norm clipping and a weight-decay mask (optax); the
schedule is written once, for a solo run's Python numbers and a population member's traced ones.
Under μP or CompleteP (model.parametrization) the tensors fall into groups by role, each with its
own AdamW (optax.multi_transform) at the group's rate, epsilon and decay multipliers."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import initializer, lora
from transformers_jax.modules import parametrization
from transformers_jax.train_config import SCHEDULES

# matmul weights: dense kernels, MoE expert weights, LoRA adapters
DECAYED = ("kernel", "wi", "wi_1", "wo", "lora_a", "lora_b")


# The hyperparameters a population varies per member (train/members.py); a solo run's are the
# config's own fields of these names.
HPARAMS = ("learning_rate", "weight_decay", "warmup_steps", "z_loss")


def config_hparams(config) -> dict:
  """{name: the config's value} of HPARAMS, as Python numbers (a solo run)."""
  return {name: config.get(name, 0.0) for name in HPARAMS}


def learning_rate(config, step, peak=None, warmup=None):
  """The rate at `step` (an int or a traced integer): linear warmup from 0 to the peak over
  `warmup` steps, then the config's decay over the remaining steps. `peak` and `warmup` default
  to the config's learning_rate and warmup_steps; Python numbers (a solo run) and traced
  scalars (a population member's) give the same values, written with optax's arithmetic.

  rsqrt is the 2017 paper's d^-0.5 * min(step^-0.5, step * warmup^-1.5) with its peak set to
  the learning rate: lr * min(step / warmup, sqrt(warmup / step)).
  """
  peak = config.learning_rate if peak is None else peak
  warmup = config.warmup_steps if warmup is None else warmup
  kind = config.lr_schedule
  if kind not in SCHEDULES:
    raise ValueError(f"lr_schedule={kind!r}: choose one of {', '.join(SCHEDULES)}")
  if kind == "rsqrt":
    w = jnp.maximum(warmup, 1)
    s = jnp.asarray(step, jnp.float32)
    return peak * jnp.minimum(s / w, jnp.sqrt(w / jnp.maximum(s, 1.0)))
  decay = jnp.maximum(config.steps - warmup, 1)
  t = step - warmup  # steps since the warmup ended
  if kind == "cosine":  # optax.cosine_decay_schedule
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(t, decay) / decay))
    after = peak * ((1 - config.min_lr_ratio) * cosine + config.min_lr_ratio)
  elif kind == "linear":  # optax.linear_schedule(peak, 0, decay)
    after = peak * (1 - jnp.clip(t, 0, decay) / decay)
  else:
    after = peak * jnp.ones((), jnp.float32)
  if isinstance(warmup, (int, float)) and warmup == 0:
    return after
  warm = (0.0 - peak) * (1 - jnp.clip(step, 0, warmup) / warmup) + peak  # linear_schedule(0, peak)
  return jnp.where(step < warmup, warm, after)


def schedule(config, peak=None, warmup=None) -> optax.Schedule:
  """step -> learning_rate(config, step, peak, warmup)."""
  return lambda step: learning_rate(config, step, peak, warmup)


def decay_mask(params, decay_embeddings: bool = False):
  """True for weights that get weight decay: matmul weights, and embeddings if asked.

  Biases, norm scales/biases, the class token and (by default) embedding tables are left alone.
  """

  def decide(path, _):
    name = jax.tree_util.keystr(path[-1:], simple=True)
    return name in DECAYED or (decay_embeddings and name == "embedding")

  return jax.tree_util.tree_map_with_path(decide, params)


@functools.lru_cache(maxsize=16)
def tensor_groups(model_cfg) -> dict[str, tuple[float, float, float]]:
  """{parameter path (jax keystr): its (rate, epsilon, decay) multipliers} under the model's
  parametrisation, each tensor's role read off its logical axis names
  (modules/parametrization.py)."""
  boxed = jax.eval_shape(initializer(model_cfg), jax.random.PRNGKey(0))
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
  pairs = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(boxed, is_leaf=is_box)[0]:
    names = tuple(leaf.names) if isinstance(leaf, nn.Partitioned) else (None,) * leaf.ndim
    leaf_name = jax.tree_util.keystr(path[-1:], simple=True)
    pairs.append((jax.tree_util.keystr(path), leaf_name, names, tuple(nn.unbox(leaf).shape)))
  return parametrization.optimizer_groups(model_cfg, tuple(pairs))


def make_optimizer(config, hparams=None) -> optax.GradientTransformation:
  """The config's optimizer, with `hparams` ({name: value} of HPARAMS; Python numbers or, for a
  population member, traced scalars) in place of the config's own values when given."""
  h = config_hparams(config) if hparams is None else hparams
  parts = []
  if config.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip))
  model_cfg = ModelConfig.from_dict(config.model)

  def adamw(rate=1.0, eps=1.0, decay=1.0):  # the config's AdamW, scaled per tensor group
    return optax.adamw(
        schedule(config, h["learning_rate"] * rate, h["warmup_steps"]),
        b1=config.adam_b1,
        b2=config.adam_b2,
        eps=config.adam_eps * eps,
        weight_decay=h["weight_decay"] * decay,
        mask=lambda p: decay_mask(p, config.decay_embeddings),
    )

  if model_cfg.parametrization == "sp":
    parts.append(adamw())
  else:  # μP / CompleteP: one AdamW per group of tensors that share their multipliers
    groups = tensor_groups(model_cfg)
    names = {
        scales: f"rate{scales[0]:g}_eps{scales[1]:g}_decay{scales[2]:g}"
        for scales in set(groups.values())
    }
    transforms = {name: adamw(*scales) for scales, name in names.items()}

    def labels(params):
      key = lambda path: jax.tree_util.keystr(path)  # noqa: E731
      return jax.tree_util.tree_map_with_path(lambda p, _: names[groups[key(p)]], params)

    parts.append(optax.multi_transform(transforms, labels))
  tx = optax.chain(*parts)
  if not model_cfg.lora_rank and not lora.has_state(model_cfg):
    return tx
  # LoRA: the state covers the adapters only (the update body passes their gradients alone);
  # the routers' bias (state, modules/moe_routing.py) has none
  return optax.GradientTransformation(
      lambda params: tx.init(lora.trainable(params, model_cfg)), tx.update
  )
