"""Checks of a ModelConfig (`validate`, run on construction, before anything is traced) and the
choices its string fields take: a mistake is a ValueError naming the field and the fix."""

from __future__ import annotations

import dataclasses
import math
import numbers

from transformers_jax.modules import feed_forward, glu, inits, layer_types, lora, mla
from transformers_jax.modules import moe_routing, parametrization, quantization, remat, scores
from transformers_jax.modules.activations import ACTIVATIONS
from transformers_jax.modules.norms import NORM_KINDS
from transformers_jax.modules.placement_base import config_problem
from transformers_jax.modules.placements import PLACEMENTS
from transformers_jax.modules.positions import POSITION_SCHEMES, position_scheme

FAMILIES = ("decoder", "encoder", "encoder_decoder", "vit")
# The registries' names as they stood at import (choices() reads the registries themselves).
POSITIONS = tuple(POSITION_SCHEMES)
NORMS = tuple(NORM_KINDS)
FEED_FORWARDS = tuple(feed_forward.FEED_FORWARDS)
MOE_IMPLS = ("dense", "ragged")
ATTENTION_IMPLS = ("auto", "fused", "cudnn", "einsum", "flash", "splash")
REMAT_POLICIES = remat.POLICIES  # modules/remat.py says what each keeps
DTYPES = ("float32", "bfloat16", "float16")
HEADS = {
    "decoder": ("lm",),
    "encoder_decoder": ("lm",),
    "encoder": ("pooler", "mlm", "classifier"),
    "vit": ("classifier", "pooler", "none"),
}
POOLS = ("cls", "mean")
QK_NORM_KINDS = ("head", "full", "l2")


def registries() -> dict[str, dict]:
  """Each model field whose names are a registry's keys, and the registry, as it stands: every
  entry is the one place its name, its one-line summary (common.summary_of), its own checks and
  its parameters are defined."""
  return {
      "positions": POSITION_SCHEMES,  # modules/positions/
      "norm_placement": PLACEMENTS,  # modules/placements/
      "init": inits.INITS,  # modules/inits.py
      "parametrization": parametrization.PARAMETRIZATIONS,  # modules/parametrization.py
      "norm": NORM_KINDS,  # modules/norms.py, modules/norm_kinds.py
      "activation": ACTIVATIONS,  # modules/activations.py
      "feed_forward": feed_forward.FEED_FORWARDS,  # modules/feed_forward.py
  }


def choices() -> dict[str, tuple[str, ...]]:
  """Each model field that takes one of a fixed set of names, and the names: the registries'
  (placements, initialisations, position schemes, norm kinds, activations, feed-forward kinds,
  remat policies) read as they stand, so the checks, --config_help and docs/config.md list every
  entry and no stale one."""
  named = {field: tuple(registry) for field, registry in registries().items()}
  return {
      "family": FAMILIES,
      "positions": named["positions"],
      "norm_placement": named["norm_placement"],
      "init": named["init"],
      "parametrization": named["parametrization"],
      "norm": named["norm"],
      "activation": named["activation"],
      "feed_forward": named["feed_forward"],
      "moe_impl": MOE_IMPLS,
      "moe_score": moe_routing.SCORES,
      "attention_impl": ATTENTION_IMPLS,
      "context_strategy": ("all_gather", "ring"),
      "remat": tuple(REMAT_POLICIES),
      "dtype": DTYPES,
      "param_dtype": DTYPES,
      "pool": POOLS,
      "qk_norm_kind": QK_NORM_KINDS,
  }


def _fail(field: str, problem: str, fix: str):
  raise ValueError(f"model.{field}={problem}: {fix}")


def _choice(cfg, field, options):
  value = getattr(cfg, field)
  if value not in options:
    _fail(field, repr(value), f"choose one of {', '.join(options)}")


# Largest vocabulary: token ids are int32 everywhere.
MAX_VOCAB = 2**31 - 1
# Largest vocab_multiple: 128 per tensor-parallel device covers any mesh of up to 32 devices.
MAX_VOCAB_MULTIPLE = 4096


def _check_types(c) -> None:
  """Every field holds its declared type (an int, not 1.5 or "32"; a finite float; a bool)."""
  for f in dataclasses.fields(c):
    value, declared = getattr(c, f.name), str(f.type)
    if value is None and "None" in declared:
      continue
    kind = declared.split(" |")[0]
    if kind == "int":
      ok = isinstance(value, numbers.Integral) and type(value).__name__ not in ("bool", "bool_")
      want = "an integer"
    elif kind == "float":
      ok = isinstance(value, numbers.Real) and type(value).__name__ not in ("bool", "bool_")
      ok = ok and math.isfinite(value)
      want = "a finite number"
    elif kind == "bool":
      ok, want = type(value).__name__ in ("bool", "bool_"), "True or False"
    else:
      ok, want = isinstance(value, str), "a string"
    if not ok:
      _fail(f.name, repr(value), f"must be {want}")


def _check_heads(c, heads: int, prefix: str = "") -> None:
  """`heads` query heads (a stack's: the decoder's own with prefix decoder_) divide d_model and
  split into the kv heads. (Latent attention has widths of its own: only cross-attention reads
  head_dim beside it.)"""
  uses_head_dim = not c.mla or c.family == "encoder_decoder"
  if c.head_dim is None and c.d_model % heads and uses_head_dim:
    _fail(
        prefix + "num_heads",
        str(heads),
        f"must divide d_model={c.d_model} (or set model.head_dim explicitly)",
    )
  kv = heads if c.num_kv_heads is None else c.num_kv_heads
  if heads % kv:
    _fail("num_kv_heads", str(kv), f"must divide {prefix}num_heads={heads}")


def validate(c) -> None:
  """Raise ValueError naming the field and the fix; called on construction, before tracing."""
  _check_types(c)
  for field, options in choices().items():
    _choice(c, field, options)
  if c.head and c.head not in HEADS[c.family]:
    _fail("head", repr(c.head), f"the {c.family} family has heads {', '.join(HEADS[c.family])}")
  positive = "num_layers d_model num_heads max_len attention_query_blocks vocab_multiple"
  positive += " residual_streams"
  for field in ("mup_base_width", "mup_base_depth"):
    if getattr(c, field) < 0:
      _fail(field, str(getattr(c, field)), "must be >= 0 (0: none)")
  for field in positive.split() + ["sliding_every"]:
    if getattr(c, field) < 1:
      _fail(field, str(getattr(c, field)), "must be a positive integer")
  for field in ("attention_block_q", "attention_block_kv"):
    value = getattr(c, field)
    if not isinstance(value, int) or value < 8 or value % 8:
      _fail(field, str(value), "must be a positive multiple of 8 (e.g. 512)")
    if c.attention_impl == "splash" and value % 128:
      _fail(field, str(value), "splash attention needs a multiple of 128 (the TPU lane width)")
  if c.attention_impl in ("flash", "splash") and c.attention_dropout > 0:
    _fail(
        "attention_dropout",
        str(c.attention_dropout),
        f"{c.attention_impl} attention has no attention dropout: set it to 0 or use "
        "model.attention_impl=einsum",
    )
  sized = ("num_encoder_layers", "num_decoder_layers", "num_kv_heads", "head_dim", "d_ff")
  for field in sized + ("decoder_num_heads", "decoder_d_ff"):
    value = getattr(c, field)
    if value is not None and value < 1:
      _fail(field, str(value), "must be a positive integer or None (derived)")
  for field in ("decoder_num_heads", "decoder_d_ff"):
    if getattr(c, field) is not None and c.family != "encoder_decoder":
      _fail(
          field, str(getattr(c, field)), "only an encoder_decoder has a decoder stack: leave None"
      )
  if c.decoder_num_heads is not None:
    _check_heads(c, c.decoder_num_heads, "decoder_")
  _check_heads(c, c.num_heads)
  if c.qk_norm_kind != "head" and not c.qk_norm:
    _fail("qk_norm_kind", repr(c.qk_norm_kind), "only q/k norms read it: set qk_norm=True")
  if c.family != "vit" and c.vocab_size < 1:
    _fail("vocab_size", str(c.vocab_size), "must be a positive integer")
  if c.vocab_size > MAX_VOCAB:
    _fail("vocab_size", f"{c.vocab_size:,}", f"token ids are int32: at most {MAX_VOCAB:,}")
  if c.vocab_multiple > MAX_VOCAB_MULTIPLE:
    _fail(
        "vocab_multiple",
        str(c.vocab_multiple),
        f"at most {MAX_VOCAB_MULTIPLE} (128 per tensor-parallel device, as Megatron pads, "
        "covers any mesh)",
    )
  if c.score_scale_width and not c.scale_scores:
    _fail("score_scale_width", str(c.score_scale_width), "unscaled scores take no width: set 0")
  if c.position_offset and c.positions != "learned":
    _fail("position_offset", str(c.position_offset), "only learned positions have rows to offset")
  nonnegative = "type_vocab_size sliding_window attention_softcap logit_softcap position_offset"
  for field in nonnegative.split() + ["score_scale_width"]:
    if getattr(c, field) < 0:
      _fail(field, str(getattr(c, field)), "must be >= 0 (0: none)")
  for field in ("dropout", "attention_dropout"):
    if not 0.0 <= getattr(c, field) < 1.0:
      _fail(field, str(getattr(c, field)), "must be in [0, 1)")
  if not c.norm_eps > 0:
    _fail("norm_eps", str(c.norm_eps), "must be positive")
  if c.head_kind == "classifier" and c.num_classes < 1:
    _fail("num_classes", str(c.num_classes), "a classifier head needs num_classes >= 1")
  if c.family == "vit" and c.embed_scale_learned:
    _fail("embed_scale_learned", "True", "a ViT has no token embeddings to scale: set False")
  if c.family == "vit":
    if c.patch_size < 1 or c.image_size < 1:
      _fail("patch_size", str(c.patch_size), "image_size and patch_size must be positive")
    if c.image_size % c.patch_size:
      _fail("image_size", str(c.image_size), f"must be divisible by patch_size={c.patch_size}")
    if c.num_channels < 1:
      _fail("num_channels", str(c.num_channels), "must be a positive integer")
  checks = (
      lambda c: config_problem(c, PLACEMENTS[c.norm_placement]),  # placement_base.py
      inits.config_problem,
      parametrization.config_problem,
      lora.config_problem,
      remat.config_problem,
      position_scheme(c).config_problem,
      NORM_KINDS[c.norm].config_problem,
      feed_forward.config_problem,
      feed_forward.router_problem,
      glu.config_problem,
      scores.config_problem,
      layer_types.config_problem,
      mla.config_problem,
      quantization.config_problem,
  )
  for problem in (check(c) for check in checks):
    if problem:
      _fail(*problem)
  if c.mtp_depth < 0 or (c.mtp_depth and c.family != "decoder"):
    _fail("mtp_depth", str(c.mtp_depth), "multi-token prediction: >= 0, on a decoder only")
  if c.stack_embeddings and not (c.family == "encoder_decoder" and c.share_embeddings):
    _fail("stack_embeddings", "True", "only an encoder_decoder with share_embeddings=True")
