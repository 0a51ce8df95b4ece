"""The model configuration (`model.py`: ModelConfig, every field with its default and meaning),
its checks and choices (`checks.py`), and experiment config files (`files.py`)."""

from transformers_jax.config.checks import (
    ATTENTION_IMPLS,
    DTYPES,
    FAMILIES,
    FEED_FORWARDS,
    HEADS,
    MAX_VOCAB,
    MAX_VOCAB_MULTIPLE,
    MOE_IMPLS,
    NORMS,
    POOLS,
    POSITIONS,
    REMAT_POLICIES,
    choices,
    registries,
    validate,
)
from transformers_jax.config.files import load_config_module, model_config_dict
from transformers_jax.config.model import ModelConfig

__all__ = [
    "ATTENTION_IMPLS",
    "DTYPES",
    "FAMILIES",
    "FEED_FORWARDS",
    "HEADS",
    "MAX_VOCAB",
    "MAX_VOCAB_MULTIPLE",
    "MOE_IMPLS",
    "NORMS",
    "POOLS",
    "POSITIONS",
    "REMAT_POLICIES",
    "ModelConfig",
    "choices",
    "registries",
    "load_config_module",
    "model_config_dict",
    "validate",
]
