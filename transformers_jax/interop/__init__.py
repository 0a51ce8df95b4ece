"""Conversion to and from other libraries' checkpoints: `hf` reads and writes Hugging Face
GPT-2, BERT and ViT models (config.json + safetensors) without torch or transformers."""

from transformers_jax.interop.common import (
    CorruptCheckpoint,
    HFCheckpointError,
    MissingCheckpointFile,
    MissingTensor,
    TensorShapeMismatch,
    UnexpectedTensor,
    UnsupportedArchitecture,
    UnsupportedConfig,
)
from transformers_jax.interop.families import SUPPORTED_ARCHITECTURES
from transformers_jax.interop.hf import load_hf
from transformers_jax.interop.hf_export import save_hf

__all__ = [
    "load_hf",
    "save_hf",
    "SUPPORTED_ARCHITECTURES",
    "HFCheckpointError",
    "UnsupportedArchitecture",
    "MissingCheckpointFile",
    "CorruptCheckpoint",
    "MissingTensor",
    "UnexpectedTensor",
    "TensorShapeMismatch",
    "UnsupportedConfig",
]
