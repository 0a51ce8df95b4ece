"""The Hugging Face architectures this project reads and writes, one Family each (interop/gpt2.py,
bert.py, vit.py, llama.py, llama4.py, qwen3.py, gemma3.py, olmo.py, phi3.py ...), and the parameter shapes a config implies: what reading (hf.py) and writing
(hf_export.py) share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers_jax.config import ModelConfig
from transformers_jax.interop.bart import Bart
from transformers_jax.interop.bert import BERT
from transformers_jax.interop.common import Family
from transformers_jax.interop.deepseek import DeepSeekV3
from transformers_jax.interop.gpt2 import GPT2
from transformers_jax.interop.gemma import Gemma, Gemma2
from transformers_jax.interop.gemma3 import Gemma3
from transformers_jax.interop.gpt_oss import GptOss
from transformers_jax.interop.llama import Llama, Mistral, Mixtral, Qwen2
from transformers_jax.interop.llama4 import Llama4Text
from transformers_jax.interop.marian import Marian
from transformers_jax.interop.olmo import Olmo2, Olmo3
from transformers_jax.interop.phi3 import Phi3
from transformers_jax.interop.qwen3 import Qwen3, SmolLM3
from transformers_jax.interop.qwen3_moe import Qwen3Moe
from transformers_jax.interop.t5 import T5
from transformers_jax.interop.vit import ViT

# One entry per Hugging Face model type; an architecture is found through its family (a model
# is written as the first whose default_architecture takes it: gpt-oss and Qwen3-MoE before
# Llama, which writes any other RoPE decoder with experts as Mixtral).
FAMILIES: tuple[Family, ...] = (
    GPT2(),
    BERT(),
    ViT(),
    DeepSeekV3(),  # before Llama: a RoPE decoder with latent attention is written as DeepSeek-V3
    GptOss(),
    Llama4Text(),  # before Qwen3-MoE: experts scaled on the way in (with q/k norms or none)
    Qwen3Moe(),
    Llama(),
    Mistral(),
    Mixtral(),
    Qwen2(),
    Gemma(),
    Gemma2(),
    Gemma3(),
    Qwen3(),
    SmolLM3(),
    Olmo2(),
    Olmo3(),
    Phi3(),
    T5(),
    Marian(),
    Bart(),
)
FAMILY_OF = {arch: f for f in FAMILIES for arch in f.architectures}
SUPPORTED_ARCHITECTURES = {arch: f.model_type for arch, f in FAMILY_OF.items()}
MODEL_TYPE_DEFAULT = {f.model_type: next(iter(f.architectures)) for f in FAMILIES}
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def flatten(tree, prefix=()) -> dict[tuple[str, ...], Any]:
  """{path of keys: leaf} of a nested dict."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten(value, prefix + (key,)))
    else:
      out[prefix + (key,)] = value
  return out


def flat_shapes(tree) -> dict[tuple[str, ...], tuple[int, ...]]:
  return {path: tuple(leaf.shape) for path, leaf in flatten(tree).items()}


def expected_shapes(c: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  from transformers_jax.models import param_shapes

  return flat_shapes(param_shapes(c.unrolled()))
