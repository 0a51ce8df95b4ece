"""LoRA's parameters in a model's tree: which are trained, and the adapters merged away.

With `model.lora_rank` > 0 every projection `model.lora_targets` names holds `lora_a`
[*in, r] and `lora_b` [r, *out] beside its `kernel` (modules/common.py, DenseWeights), and its
output gains (lora_alpha / r) * (x A) B. Training differentiates and updates the adapters
only (`trainable` / `with_trainable`); everything else stays as loaded. `merged` folds the
adapters into the kernels, which gives the plain model of the same architecture (what export
to Hugging Face writes by default).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from transformers_jax.modules import moe_routing
from transformers_jax.modules.lora import projections, trained_in_full

ADAPTER_NAMES = ("lora_a", "lora_b")


def _is_tree(x) -> bool:
  return hasattr(x, "items")


def _filter(tree, keep, path=()):
  """The nested dict of `tree`'s leaves whose name `keep`s (or, for a `keep` of two
  arguments, whose name and path from the root), empty branches dropped."""
  out = {}
  for name, value in tree.items():
    if _is_tree(value):
      sub = _filter(value, keep, (*path, name))
      if sub:
        out[name] = sub
    elif keep(name) if keep.__code__.co_argcount == 1 else keep(name, (*path, name)):
      out[name] = value
  return out


def has_state(model_cfg) -> bool:
  """Whether the parameter tree holds state that is never trained (the routers' bias)."""
  return model_cfg.feed_forward == "moe" and model_cfg.moe_score_bias


def trainable(params, model_cfg) -> Any:
  """What training differentiates and updates: with LoRA the adapters' leaves and the modules
  model.lora_modules_to_save trains in full (a nested dict like `params` holding just them),
  else `params` itself; either less any state (the routers' bias, modules/moe_routing.py,
  which the update body sets)."""
  if model_cfg.lora_rank:
    return _filter(params, lambda name, path: is_trained(model_cfg, path))
  if has_state(model_cfg):
    return _filter(params, lambda name: name != moe_routing.BIAS)
  return params


def is_trained(model_cfg, path: tuple[str, ...]) -> bool:
  """Whether training updates parameter `path`: an adapter or a module trained in full under
  LoRA, every parameter but the routers' bias without it."""
  if path[-1] == moe_routing.BIAS and has_state(model_cfg):
    return False
  return not model_cfg.lora_rank or path[-1] in ADAPTER_NAMES or trained_in_full(model_cfg, path)


def base(params) -> Any:
  """`params` without the adapters: the frozen model LoRA was trained on."""
  return _filter(params, lambda name: name not in ADAPTER_NAMES)


def with_trainable(params, updated, model_cfg) -> Any:
  """`params` with the leaves of `updated` (a `trainable(params, ...)` tree) put back."""
  if not model_cfg.lora_rank and not has_state(model_cfg):
    return updated

  def put(base, new):
    out = dict(base)
    for name, value in new.items():
      out[name] = put(base[name], value) if _is_tree(value) else value
    return out

  return put(params, updated)


def merged(params, model_cfg):
  """(params with every adapter folded into its kernel and the adapter leaves dropped, the
  same config without LoRA): the plain model that computes what the adapted one does (in
  float32, cast back to each kernel's dtype)."""
  if not model_cfg.lora_rank:
    return params, model_cfg
  scale = model_cfg.lora_alpha / model_cfg.lora_rank

  def fold(tree):
    out = {}
    for name, value in tree.items():
      if _is_tree(value):
        out[name] = fold(value)
      elif name not in ADAPTER_NAMES:
        out[name] = value
    if "lora_a" in tree:
      kernel, a, b = tree["kernel"], tree["lora_a"], tree["lora_b"]
      out["kernel"] = (jnp.asarray(kernel, jnp.float32) + kernel_delta(kernel, a, b, scale)).astype(
          jnp.asarray(kernel).dtype
      )
    return out

  return fold(params), without_lora(model_cfg)


def without_lora(model_cfg):
  """The same model without LoRA's fields: the plain model its adapters merge into."""
  return model_cfg.replace(lora_rank=0, lora_modules_to_save="")


def takes_adapters(source_cfg, model_cfg) -> bool:
  """Whether a model of `model_cfg` computes what one of `source_cfg` does when it takes that
  model's adapters as they are: the same rank (so the shapes match) and alpha (so the scale
  alpha / r does), and every projection adapted there adapted here. Otherwise the source's
  adapters are to be merged into its kernels first (`merged`)."""
  return (
      model_cfg.lora_rank == source_cfg.lora_rank
      and model_cfg.lora_alpha == source_cfg.lora_alpha
      and projections(source_cfg) <= projections(model_cfg)
  )


def kernel_delta(kernel, a, b, scale: float):
  """scale * A B in the shape of `kernel` [*lead, *in, *out], for A [*lead, *in, r] and
  B [*lead, r, *out] (lead: a scanned stack's layers axis, a population's members axis)."""
  k, a, b = np.shape(kernel), jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  n_out = len(k) - a.ndim + 1  # kernel = lead + in + out, A = lead + in + 1
  lead = b.ndim - 1 - n_out  # B = lead + 1 + out
  flat_a = a.reshape(*a.shape[:lead], -1, a.shape[-1])  # [*lead, n_in, r]
  flat_b = b.reshape(*b.shape[: lead + 1], -1)  # [*lead, r, n_out]
  return (jnp.matmul(flat_a, flat_b) * scale).reshape(k)
