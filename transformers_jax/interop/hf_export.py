"""Writing this project's parameters as a Hugging Face model (config.json + model.safetensors)
that transformers' `from_pretrained` loads; reading them back is hf.py."""

from __future__ import annotations

import json
import pathlib
from typing import Any
from collections.abc import Mapping

import numpy as np

from transformers_jax.config import ModelConfig
from transformers_jax.interop.common import (
    ACTIVATIONS_OUT,
    TensorShapeMismatch,
    UnsupportedConfig,
    hf_shapes,
    to_hf,
)
from transformers_jax.interop.families import (
    FAMILIES,
    FAMILY_OF,
    SUPPORTED_ARCHITECTURES,
    INDEX,
    WEIGHTS,
    expected_shapes,
)
from transformers_jax.interop.tensor_files import MAX_SHARD_BYTES, LazyArrays, write_shards
from transformers_jax.modules import moe_routing


def default_architecture(c: ModelConfig) -> str:
  for family in FAMILIES:
    architecture = family.default_architecture(c)
    if architecture:
      return architecture
  return ""


def _check_exportable(c: ModelConfig, architecture: str) -> None:
  """Raise UnsupportedConfig naming the first field that the architecture cannot express."""
  family = FAMILY_OF[architecture]
  want = dict(  # what every supported architecture needs
      head_kind=family.architectures[architecture],
      positions="learned",
      position_offset=0,
      stack_embeddings=False,
      norm="layernorm",
      norm_scale=True,
      has_norm_bias=True,
      use_bias=True,
      has_ffn_bias=c.use_bias,  # the feed-forward biased as the attention is
      residual=True,
      feed_forward="dense",
      embed_scale=False,
      embed_scale_learned=False,
      qk_norm=False,  # only Qwen3, Gemma 3 and OLMo 2/3 normalise queries and keys
      qk_norm_kind="head",
      qk_norm_rope_only=False,  # Llama 4's alone, as its temperature on NoPE layers
      attention_temperature_floor=0,
      kv_heads=c.num_heads,
      activation=tuple(ACTIVATIONS_OUT),
      qkv_bias=(None, c.use_bias),
      scale_scores=True,
      score_scale_width=0,
      unembed_scale=False,
      norm_unit_offset=False,
      sliding_window=0,
      layer_types="",
      rope_local_theta=0.0,
      attention_chunk=0,
      decoder_num_heads=None,  # one shape for both stacks, unless BART's or Marian's
      decoder_d_ff=None,
      attention_softcap=0.0,
      logit_softcap=0.0,
      rope_scaling="",
      value_residual=False,  # no Hugging Face architecture here mixes in the first block's values
      attention_sinks=False,  # gpt-oss's alone
      router_bias=False,  # gpt-oss's alone
      router_norm_topk=True,  # Mixtral's and gpt-oss's routing; Qwen3-MoE's either way
      mla=False,  # multi-head latent attention and DeepSeek's MoE: DeepSeek-V3's alone
      mtp_depth=0,
      **moe_routing.DEEPSEEK_DEFAULTS,
  )
  want.update(family.requirements(c, architecture))
  for field, value in want.items():
    have = getattr(c, field)
    if have not in (value if isinstance(value, tuple) else (value,)):
      allowed = " or ".join(map(repr, value)) if isinstance(value, tuple) else repr(value)
      raise UnsupportedConfig(
          f"cannot write model.{field}={have!r} as {architecture} (which needs {allowed}): "
          "change the config or pick another architecture"
      )
  if c.head_width * c.num_heads != c.d_model and not family.explicit_head_dim:
    raise UnsupportedConfig(
        f"cannot write model.head_dim={c.head_width} as {architecture}: Hugging Face uses "
        f"d_model / num_heads = {c.d_model / c.num_heads:g}; leave model.head_dim unset"
    )
  family.check_exportable(c, architecture)


def exportable_as(c: ModelConfig, architecture) -> bool:
  """Whether `c` (its LoRA adapters merged) can be written as `architecture`."""
  if architecture not in FAMILY_OF:
    return False
  try:
    _check_exportable(c.replace(lora_rank=0, lora_modules_to_save=""), architecture)
  except UnsupportedConfig:
    return False
  return True


def save_hf(
    directory,
    model,
    params,
    architecture: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
    shard_bytes: int = MAX_SHARD_BYTES,
) -> str:
  """Write `params` of `model` (ModelConfig, fields dict or ConfigDict) as a Hugging Face model.

  Writes config.json and model.safetensors into `directory` (created if needed), which
  transformers' `<architecture>.from_pretrained(directory)` loads. `architecture` defaults to the
  one matching the family and head (GPT2LMHeadModel, BertModel, BertForMaskedLM, ViTModel,
  ViTForImageClassification). `params` may be boxed, scanned (`layers`) or looped, jax or numpy.
  `extra_config` entries (token ids, id2label, ...) are merged into config.json. Tensors are
  converted and written one at a time into shards of at most `shard_bytes` (more than one shard
  adds model.safetensors.index.json), so at most one rule's converted tensors are in memory beside
  `params`. Returns the architecture written.
  """
  from flax import linen as nn

  from transformers_jax.models import as_model_config, lora
  from transformers_jax.modules.block import scan_to_loop

  c = as_model_config(model)
  params = params.get("params", params) if "params" in params and len(params) == 1 else params
  # LoRA adapters are folded into their kernels: the plain model of the same architecture
  params, c = lora.merged(nn.unbox(params), c)
  architecture = architecture or default_architecture(c)
  if architecture not in FAMILY_OF:
    raise UnsupportedConfig(
        f"cannot write a {c.family} model with head {c.head_kind!r} as {architecture or 'any'} "
        f"Hugging Face architecture: supported are {', '.join(SUPPORTED_ARCHITECTURES)}"
    )
  family = FAMILY_OF[architecture]
  _check_exportable(c, architecture)
  flat = {p: np.asarray(v) for p, v in flat_arrays(scan_to_loop(nn.unbox(params))).items()}
  if c.padded_vocab != c.vocab_size:  # Hugging Face holds the V real rows only
    flat = _unpad_vocab(flat, c)
    c = c.replace(vocab_multiple=1)
  expected = expected_shapes(c)
  missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
  if missing:
    raise UnsupportedConfig(
        f"params have no {'/'.join(missing[0])}, which the config implies: pass the parameters "
        "made with this config"
    )
  if extra:
    raise UnsupportedConfig(
        f"params hold {'/'.join(extra[0])}, which the config does not imply: pass the config "
        "these parameters were made with"
    )
  for path, want in expected.items():
    if flat[path].shape != want:
      raise TensorShapeMismatch(
          f"params {'/'.join(path)} has shape {flat[path].shape}, the config implies {want}: "
          "pass the matching config"
      )

  tensors = LazyArrays()  # each tensor converted when its shard is written
  rules = family.rules(c, family.base_prefix.get(architecture, ""))
  unwritten = sorted(set(flat) - {p for rule in rules for p in rule.ours})
  if unwritten:  # a parameter the architecture has no tensor for would be lost
    raise UnsupportedConfig(
        f"cannot write params {'/'.join(unwritten[0])} ({len(unwritten)} tensors in all) as "
        f"{architecture}, which has no tensor for them: change the config or export elsewhere"
    )
  converted = {}  # the last rule's outputs: a rule with several tensors converts once

  def output(rule, i):
    if converted.get("rule") is not rule:
      converted.update(rule=rule, arrays=to_hf(rule, [flat[p] for p in rule.ours]))
    return converted["arrays"][i]

  dtypes = set()
  for rule in rules:
    shapes = hf_shapes(rule, [flat[p].shape for p in rule.ours])
    dtypes.add(str(flat[rule.ours[0]].dtype))
    for i, (name, shape) in enumerate(zip(rule.hf, shapes)):
      tensors.plan(name, shape, flat[rule.ours[0]].dtype, lambda r=rule, i=i: output(r, i))
  family.adjust_saved(tensors, c)
  hf = {
      "architectures": [architecture],
      "model_type": family.model_type,
      "dtype": dtypes.pop() if len(dtypes) == 1 else "float32",
      **family.hf_config(c, architecture),
      **(extra_config or {}),
  }
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
  for stale in [
      directory / WEIGHTS,
      directory / INDEX,
      *directory.glob("model-*-of-*.safetensors"),
  ]:
    stale.unlink(missing_ok=True)  # (an overwritten folder: none of the old files remain)
  write_shards(directory, list(tensors), tensors.spec, tensors.__getitem__, WEIGHTS, shard_bytes)
  return architecture


def _unpad_vocab(flat: Mapping[tuple[str, ...], np.ndarray], c: ModelConfig) -> dict:
  """Drop the rows that pad the vocabulary to `vocab_multiple`: the token embedding's first
  axis, an untied unembedding's last, the MLM output bias."""
  out = {}
  for path, array in flat.items():
    if "token_embed" in path and array.shape[:1] == (c.padded_vocab,):
      array = array[: c.vocab_size]
    elif path[0] in ("lm_head", "mlm_decoder", "mlm_bias") and array.shape[-1] == c.padded_vocab:
      array = array[..., : c.vocab_size]
    out[path] = array
  return out


def flat_arrays(tree, prefix=()) -> dict[tuple[str, ...], Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flat_arrays(value, prefix + (str(key),)))
    else:
      out[prefix + (str(key),)] = value
  return out
