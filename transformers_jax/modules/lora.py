"""LoRA's settings in the model definition: which projections `model.lora_targets` names, what
the config must satisfy, and the adapters' initialiser. The adapters themselves live in each
projection (modules/common.py, DenseWeights); models/lora.py splits a parameter tree into what
trains and what stays frozen, and folds the adapters into the kernels."""

from __future__ import annotations

import jax
from flax import linen as nn

# The name `model.lora_targets` lists -> the projections (parameter names) it adapts, in every
# attention (self and cross) or feed-forward block.
LORA_TARGETS = {
    "q": ("query",),
    "k": ("key",),
    "v": ("value",),
    "out": ("out",),
    "mlp_in": ("wi", "wi_0", "wi_1"),
    "mlp_out": ("wo",),
}


# model.lora_modules_to_save's names beyond LORA_TARGETS': the embeddings and the output head
# (each a family's top-level parameters: the LM head, a classifier and its pooler, MLM's head)
SAVED_MODULES = ("embed", "head")
HEAD_PARAMS = ("lm_head", "classifier", "pooler", "mlm_bias", "mlm_norm", "mlm_transform")


def saved_names(c) -> list[str]:
  return [t.strip() for t in c.lora_modules_to_save.split(",") if t.strip()]


def trained_in_full(c, path: tuple[str, ...]) -> bool:
  """Whether parameter `path` (names from the tree's root) lies in a module that
  model.lora_modules_to_save trains in full beside the adapters."""
  if not c.lora_rank:
    return False
  saved = set(saved_names(c))
  if "embed" in saved and path[0] == "embed":
    return True
  if "head" in saved and path[0] in HEAD_PARAMS:
    return True
  projections = {p for t in saved if t in LORA_TARGETS for p in LORA_TARGETS[t]}
  return any(name in projections for name in path[:-1])


def target_names(c) -> list[str]:
  return [t.strip() for t in c.lora_targets.split(",") if t.strip()]


def projections(c) -> frozenset[str]:
  """The parameter names of the projections LoRA adapts (empty when lora_rank is 0)."""
  if not c.lora_rank:
    return frozenset()
  return frozenset(p for t in target_names(c) for p in LORA_TARGETS.get(t, ()))


def config_problem(c) -> tuple[str, str, str] | None:
  """(field, value, fix) of the first LoRA setting that cannot work, or None."""
  if c.lora_rank < 0:
    return "lora_rank", str(c.lora_rank), "must be >= 0 (0 = no LoRA), e.g. 8"
  if not c.lora_rank:
    return None
  if not c.lora_alpha > 0:
    return "lora_alpha", str(c.lora_alpha), "must be positive (the scale is alpha / rank)"
  if not 0.0 <= c.lora_dropout < 1.0:
    return "lora_dropout", str(c.lora_dropout), "must be in [0, 1)"
  targets = target_names(c)
  if not targets or any(t not in LORA_TARGETS for t in targets):
    fix = f"a comma-separated list of {', '.join(LORA_TARGETS)} (e.g. q,v)"
    return "lora_targets", repr(c.lora_targets), fix
  saved = saved_names(c)
  unknown = [s for s in saved if s not in SAVED_MODULES + tuple(LORA_TARGETS)]
  if unknown:
    fix = f"a comma-separated list of {', '.join(SAVED_MODULES + tuple(LORA_TARGETS))}"
    return "lora_modules_to_save", repr(c.lora_modules_to_save), fix
  if "head" in saved and c.family == "decoder" and c.tie_embeddings:
    fix = "this model's output head is its token embedding (tie_embeddings): save embed"
    return "lora_modules_to_save", repr(c.lora_modules_to_save), fix
  if c.feed_forward == "moe" and {"mlp_in", "mlp_out"} & set(targets):
    fix = "LoRA adapts dense projections, not MoE experts: adapt q, k, v, out only"
    return "lora_targets", repr(c.lora_targets), fix
  # A rank above the smaller side of an adapted matrix adds parameters and no expressiveness:
  # A B cannot have a higher rank than the matrix it updates.
  sides = matrix_sides(c)
  target = min(targets, key=lambda t: min(sides[t]))
  limit = min(sides[target])
  if c.lora_rank > limit:
    n_in, n_out = sides[target]
    fix = (
        f"above {limit}, the smaller side of the adapted {target} projection ({n_in} x "
        f"{n_out}): at most {limit}"
    )
    return "lora_rank", str(c.lora_rank), fix
  return None


def matrix_sides(c) -> dict[str, tuple[int, int]]:
  """(inputs, outputs) of the matrix each `lora_targets` name adapts, as A [inputs, r] and
  B [r, outputs] see it (a kernel over several axes flattened): the same in every block, and
  in cross-attention as in self-attention. mlp_in's gated pair (wi_0, wi_1) share one shape."""
  d, ff = c.d_model, c.ff_width
  q_width, kv_width = c.num_heads * c.head_width, c.kv_heads * c.head_width
  return {
      "q": (d, q_width),
      "k": (d, kv_width),
      "v": (d, kv_width),
      "out": (q_width, d),
      "mlp_in": (d, ff),
      "mlp_out": (ff, d),
  }


def a_init(n_in: int, names: tuple[str | None, ...]):
  """LoRA's A: uniform(+-1/sqrt(fan in)), the bound of PyTorch's Linear default that the LoRA
  reference code and PEFT use (B starts at zero, so the adapted model starts as the base)."""
  bound = 1.0 / float(n_in) ** 0.5
  return nn.with_logical_partitioning(
      lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound), names
  )
