"""The four families and `build_model`, the one place a config becomes a flax module."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections

from transformers_jax.config import ModelConfig
from transformers_jax.models.decoder_only import DecoderOnly
from transformers_jax.models.encoder_decoder import EncoderDecoder
from transformers_jax.models.encoder_only import EncoderOnly
from transformers_jax.models.vit import ViT

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


def init_params(cfg, rng, batch: int = 1, length: int | None = None):
  """Initialised (boxed, logically partitioned) parameters."""
  model = build_model(cfg)
  return model.init({"params": rng}, *example_inputs(cfg, batch, length))["params"]


def param_shapes(cfg):
  """The parameter tree as ShapeDtypeStructs (no memory allocated), boxes removed."""
  from flax import linen as nn

  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  return nn.unbox(shapes)


__all__ = [
    "build_model",
    "example_inputs",
    "init_params",
    "param_shapes",
    "ModelConfig",
    "FAMILY_CLASSES",
]


def param_shardings(model_cfg, mesh, rule_table=None):
  """NamedShardings of a model's parameters on `mesh` as the logical-axis rules say (default:
  the training rules, parallel.rules()), from shapes alone."""
  from transformers_jax import parallel

  model = build_model(model_cfg)
  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *example_inputs(model_cfg)))
  table = parallel.rules() if rule_table is None else rule_table
  return parallel.logical_shardings(boxed["params"], mesh, table)
