"""The four families and `build_model`, the one place a config becomes a flax module."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections

from transformers_jax.config import ModelConfig
from transformers_jax.models.decoder_only import DecoderOnly
from transformers_jax.models.encoder_decoder import EncoderDecoder
from transformers_jax.models.encoder_only import EncoderOnly
from transformers_jax.models.vit import ViT
from transformers_jax.modules.placements import PLACEMENTS

FAMILY_CLASSES = {
    "decoder": DecoderOnly,
    "encoder": EncoderOnly,
    "encoder_decoder": EncoderDecoder,
    "vit": ViT,
}


def as_model_config(
    cfg: ModelConfig | Mapping[str, Any] | ml_collections.ConfigDict,
) -> ModelConfig:
  return cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(cfg)


def build_model(cfg, deterministic: bool = True, decode: bool = False):
  """A flax module for `cfg` (a ModelConfig or the `config.model` ConfigDict).

  `deterministic=False` turns dropout on (needs a 'dropout' rng); `decode=True` adds the KV cache.
  """
  cfg = as_model_config(cfg)
  return FAMILY_CLASSES[cfg.family](cfg, deterministic=deterministic, decode=decode)


def example_inputs(cfg, batch: int = 1, length: int | None = None) -> tuple:
  """Dummy positional inputs of the right shapes and dtypes for `init` / `eval_shape`."""
  cfg = as_model_config(cfg)
  if cfg.family == "vit":
    return (jnp.zeros((batch, cfg.image_size, cfg.image_size, cfg.num_channels), jnp.float32),)
  tokens = jnp.zeros((batch, length or min(cfg.max_len, 8)), jnp.int32)
  return (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)


def initializer(cfg, batch: int = 1, length: int | None = None):
  """rng -> the model's initialised parameters, boxed with their logical axis names: the one
  place parameters are made (training, populations, counting and the tests all call it).

  A norm placement that profiles (placement_base.Placement.profiled, e.g. Admin) then runs the
  model once, on random inputs drawn from the same rng, and sets its parameters from what the
  blocks sowed in the `profile` collection. The config's parameter constraint
  (`parameter_constraint`), if any, applies last: training starts on its manifold."""
  cfg = as_model_config(cfg)
  model = build_model(cfg)
  inputs = example_inputs(cfg, batch, length)
  placement = PLACEMENTS[cfg.norm_placement]
  constrain = parameter_constraint(cfg)

  def init(rng):
    params = model.init({"params": rng}, *inputs)["params"]
    if placement.profiled:
      probe = profile_inputs(cfg, jax.random.fold_in(rng, 1))
      _, profiled = model.apply({"params": params}, *probe, mutable=["profile"])
      params = placement.profile(params, profiled["profile"], cfg)
    return params if constrain is None else constrain_boxed(params, constrain)

  return init


def parameter_constraint(cfg) -> Callable | None:
  """The function params -> params that keeps the model's parameters where its definition
  needs them (nGPT's unit-norm weights), or None: what any part of the config declares, today
  the norm placement's (`Placement.constraint`). The training update applies it after every
  optimizer step (train/step.py, make_update: both drivers), `initializer` once at init. It
  takes one model's plain arrays, blocks looped or scanned."""
  cfg = as_model_config(cfg)
  return PLACEMENTS[cfg.norm_placement].constraint(cfg)


def constrain_boxed(params, constrain: Callable):
  """`constrain` applied to a tree of boxed (logically partitioned) parameters, boxes kept."""
  from flax import linen as nn

  values = constrain(nn.unbox(params))
  boxed = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
  return jax.tree_util.tree_map(
      lambda box, v: box.replace_boxed(v) if boxed(box) else v, params, values, is_leaf=boxed
  )


def profile_inputs(cfg, rng, batch: int = 2, length: int = 32) -> tuple:
  """Random inputs for a profiling pass: uniform token ids, or standard-normal images."""
  if cfg.family == "vit":
    shape = (batch, cfg.image_size, cfg.image_size, cfg.num_channels)
    return (jax.random.normal(rng, shape, jnp.float32),)
  tokens = jax.random.randint(rng, (batch, min(cfg.max_len, length)), 0, cfg.vocab_size)
  return (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)


def init_params(cfg, rng, batch: int = 1, length: int | None = None):
  """Initialised (boxed, logically partitioned) parameters."""
  return initializer(cfg, batch, length)(rng)


def param_shapes(cfg):
  """The parameter tree as ShapeDtypeStructs (no memory allocated), boxes removed."""
  from flax import linen as nn

  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  return nn.unbox(shapes)


__all__ = [
    "build_model",
    "example_inputs",
    "init_params",
    "initializer",
    "param_shapes",
    "parameter_constraint",
    "ModelConfig",
    "FAMILY_CLASSES",
]


def param_shardings(model_cfg, mesh, rule_table=None):
  """NamedShardings of a model's parameters on `mesh` as the logical-axis rules say (default:
  the training rules, parallel.rules()), from shapes alone."""
  from transformers_jax.machine import parallel

  boxed = jax.eval_shape(initializer(model_cfg), jax.random.PRNGKey(0))
  table = parallel.rules() if rule_table is None else rule_table
  return parallel.logical_shardings(boxed, mesh, table)
