"""A LoRA run's adapters as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)
that `peft.PeftModel.from_pretrained(base, folder)` loads onto the Hugging Face base model.

PEFT's LoRA layer adds scaling * lora_B(lora_A(dropout(x))) to a module's output, with
lora_A.weight [r, in] and lora_B.weight [out, r] (also for GPT-2's Conv1D modules, where
`fan_in_fan_out` only changes how PEFT merges). Ours adds (alpha / r) * (x A) B with A [*in, r]
and B [r, *out], so a module with its own projection takes A^T and B^T. A Hugging Face module
that fuses several of ours (GPT-2's c_attn holds query, key and value) takes one adapter of
rank n * r: A stacked over the rank axis and B block-diagonal, with that module's alpha in
`alpha_pattern` so that its scaling stays alpha / r. Which Hugging Face tensor holds which of
our kernels comes from the family's conversion rules (interop/gpt2.py, bert.py, vit.py).
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from transformers_jax.interop.common import UnsupportedConfig
from transformers_jax.interop.families import FAMILY_OF
from transformers_jax.modules.lora import trained_in_full

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
KERNEL_KINDS = ("linear", "conv1d", "fused_kernel")
TOKEN_EMBEDDING = ("embed", "token_embed", "embedding")
# PEFT's task type per architecture (the PeftModel class it loads as); None = the plain model
TASK_TYPES = {"GPT2LMHeadModel": "CAUSAL_LM"}


def peft_tensors(c, flat, rules) -> tuple[dict[str, np.ndarray], dict[str, int]]:
  """({PEFT tensor name: array}, {module: rank}) for the adapters in `flat` ({our path: array},
  looped layout), placed on the Hugging Face modules `rules` write our kernels to."""
  r, tensors, ranks = c.lora_rank, {}, {}
  for rule in rules:
    if rule.kind not in KERNEL_KINDS:
      continue
    modules = [path[:-1] for path in rule.ours]  # our projections this tensor holds
    adapted = [i for i, m in enumerate(modules) if m + ("lora_a",) in flat]
    if not adapted:
      continue
    n_in = 1 if rule.kind == "fused_kernel" else rule.n_in
    kernels = [flat[path] for path in rule.ours]
    widths = [math.prod(k.shape[n_in:]) for k in kernels]
    offsets = np.cumsum([0, *widths])
    rank = r * len(adapted)
    a_all = np.zeros((rank, math.prod(kernels[0].shape[:n_in])), np.float32)
    b_all = np.zeros((sum(widths), rank), np.float32)
    for j, i in enumerate(adapted):
      a = np.asarray(flat[modules[i] + ("lora_a",)], np.float32).reshape(-1, r)  # [in, r]
      b = np.asarray(flat[modules[i] + ("lora_b",)], np.float32).reshape(r, -1)  # [r, out_i]
      a_all[j * r : (j + 1) * r] = a.T
      b_all[offsets[i] : offsets[i + 1], j * r : (j + 1) * r] = b.T
    module = rule.hf[0].removesuffix(".weight")
    dtype = np.asarray(flat[modules[adapted[0]] + ("lora_a",)]).dtype
    tensors[f"base_model.model.{module}.lora_A.weight"] = a_all.astype(dtype)
    tensors[f"base_model.model.{module}.lora_B.weight"] = b_all.astype(dtype)
    ranks[module] = rank
  return tensors, ranks


def saved_modules(c, rules, base_folder) -> tuple[dict[str, np.ndarray], list[str]]:
  """({PEFT tensor name: array}, [Hugging Face module]) of the modules model.lora_modules_to_save
  trained in full, as the base model in `base_folder` (written from the same parameters) holds
  them: PEFT stores a saved module's weights under the module's own name."""
  from safetensors.numpy import load_file

  names = [n for rule in rules if any(trained_in_full(c, p) for p in rule.ours) for n in rule.hf]
  if not names:
    return {}, []
  stored = {}
  for path in sorted(pathlib.Path(base_folder).glob("*.safetensors")):
    stored.update(load_file(str(path)))
  names = [n for n in names if n in stored]  # a tied head is the embedding: stored once
  tensors = {f"base_model.model.{n}": stored[n] for n in names}
  modules = {n.rsplit(".", 1)[0] for n in names}
  if c.family == "decoder" and c.tie_embeddings:
    # PEFT wraps the embedding in a copy that the tied head does not follow: the head is saved
    # too, with the embedding's weights, so that both read the trained table
    token = [n for r in rules if TOKEN_EMBEDDING in r.ours for n in r.hf if n in names]
    if token:
      tensors["base_model.model.lm_head.weight"] = stored[token[0]]
      modules.add("lm_head")
  return tensors, sorted(modules)


def save_peft_adapter(directory, model, params, architecture: str, base_model: str = "") -> int:
  """Write `params`' LoRA adapters (model: a ModelConfig with lora_rank > 0) as a PEFT adapter
  folder `directory` for the Hugging Face `architecture` (what save_hf writes the base as);
  `base_model` goes into adapter_config.json as base_model_name_or_path; the modules
  model.lora_modules_to_save trained in full are read from the safetensors there (the base model
  written from the same parameters) into the adapter file. Returns the number of adapted
  modules."""
  from flax import linen as nn
  from safetensors.numpy import save_file

  from transformers_jax.interop.hf_export import flat_arrays
  from transformers_jax.modules.block import scan_to_loop

  c = model
  if not c.lora_rank:
    raise UnsupportedConfig(
        "this run has no LoRA adapters (model.lora_rank is 0): export it as a whole model "
        "(--lora=merge, the default)"
    )
  family = FAMILY_OF[architecture]
  base_cfg = c.replace(lora_rank=0, lora_modules_to_save="")
  rules = family.rules(base_cfg, family.base_prefix.get(architecture, ""))
  flat = {p: np.asarray(v) for p, v in flat_arrays(scan_to_loop(nn.unbox(params))).items()}
  tensors, ranks = peft_tensors(c, flat, rules)
  saved, modules = saved_modules(c, rules, base_model) if base_model else ({}, [])
  tensors.update(saved)
  scale = c.lora_alpha / c.lora_rank
  fan_in_fan_out = any(rule.kind == "conv1d" for rule in rules)  # GPT-2's Conv1D: [in, out]
  config = {
      "peft_type": "LORA",
      "task_type": TASK_TYPES.get(architecture),
      "base_model_name_or_path": base_model,
      "r": c.lora_rank,
      "lora_alpha": c.lora_alpha,
      "lora_dropout": c.lora_dropout,
      "target_modules": sorted(ranks),
      # a module fusing n of our projections has rank n * r and keeps the scaling alpha / r
      "rank_pattern": {m: k for m, k in sorted(ranks.items()) if k != c.lora_rank},
      "alpha_pattern": {m: scale * k for m, k in sorted(ranks.items()) if k != c.lora_rank},
      "fan_in_fan_out": fan_in_fan_out,
      "bias": "none",
      "use_rslora": False,
      "use_dora": False,
      "init_lora_weights": True,
      "inference_mode": True,
      "modules_to_save": modules or None,
  }
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  save_file(
      {k: np.ascontiguousarray(v) for k, v in tensors.items()},
      str(directory / ADAPTER_WEIGHTS),
      metadata={"format": "pt"},
  )
  (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
  return len(ranks)
