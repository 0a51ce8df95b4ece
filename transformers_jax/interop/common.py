"""What every Hugging Face architecture mapping shares: the errors, tensor rules and their
transforms, helpers for config.json and for the Llama-layout decoders, and `Family`, the interface
one model type implements (interop/gpt2.py, bert.py, vit.py). A new architecture is one such
file, registered in interop/hf.py, and its fixture test."""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from collections.abc import Mapping

import numpy as np

from transformers_jax.config import ModelConfig

ACTIVATIONS_IN = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "swish": "silu",
    "silu": "silu",
}
ACTIVATIONS_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "swish"}


class HFCheckpointError(ValueError):
  """Base class: a checkpoint or config that cannot be converted (message: problem and fix)."""


class UnsupportedArchitecture(HFCheckpointError):
  """config.json names an architecture (or an option of one) that has no mapping here."""


class MissingCheckpointFile(HFCheckpointError):
  """config.json, model.safetensors or a shard named by the index is not there."""


class CorruptCheckpoint(HFCheckpointError):
  """A file is there but cannot be parsed (truncated safetensors, invalid JSON)."""


class MissingTensor(HFCheckpointError):
  """The config implies a tensor that the checkpoint does not hold."""


class UnexpectedTensor(HFCheckpointError):
  """The checkpoint holds tensors that the config does not account for."""


class TensorShapeMismatch(HFCheckpointError):
  """A tensor's shape disagrees with the shape the config implies."""


class UnsupportedConfig(HFCheckpointError):
  """Our config (or params) cannot be written as the requested Hugging Face architecture."""


# ----------------------------------------------------------------------------- tensor rules
@dataclasses.dataclass(frozen=True)
class Rule:
  """HF tensors `hf` <-> our parameters `ours` (paths), converted as `kind`.

  kinds: copy; bias (flat <-> our bias shape); linear (torch [out, in] <-> our kernel whose first
  `n_in` axes are inputs); conv1d (GPT-2 [in, out] <-> our kernel); fused_kernel / fused_bias
  (GPT-2 c_attn <-> query, key, value); fused_linear (one torch Linear [sum of outs, in] <->
  several kernels [in, ...]: Phi-3's qkv_proj and gate_up_proj); patch (conv [D, C, P, P] <->
  [P*P*C, D]); batch1 ([1, N, D] <-> [N, D]); experts (one torch Linear [out, in] per expert
  <-> our [E, in, out]); gate_up (gpt-oss's experts [E, in, 2F], gate and up interleaved in the
  last axis <-> our two [E, in, F]); gate_up_halves (Llama 4's [E, in, 2F], the gate's columns
  then up's); gate_up_bias ([E, 2F] interleaved <-> our two [E, 1, F]);
  expert_bias ([E, W] <-> our [E, 1, W]). `patch` holds (P, C) for the patch kind. `rows`
  (linear): the order our outputs take the torch weight's rows in (DeepSeek's interleaved RoPE
  features, laid out as our RoPE pairs them); () = as they are.
  """

  kind: str
  hf: tuple[str, ...]
  ours: tuple[tuple[str, ...], ...]
  n_in: int = 1
  patch: tuple[int, int] = (0, 0)
  rows: tuple[int, ...] = ()


def hf_shapes(rule: Rule, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
  s = shapes[0]
  n = rule.n_in
  if rule.kind == "experts":
    return [(s[2], s[1])] * s[0]
  if rule.kind in ("gate_up", "gate_up_halves", "gate_up_bias", "expert_bias"):
    wide = s[:-1] + (s[-1] * (1 if rule.kind == "expert_bias" else 2),)
    return [wide if rule.kind in ("gate_up", "gate_up_halves") else (wide[0], wide[-1])]
  if rule.kind == "copy":
    return [s]
  if rule.kind == "bias":
    return [(math.prod(s),)]
  if rule.kind == "linear":
    return [(math.prod(s[n:]), math.prod(s[:n]))]
  if rule.kind == "conv1d":
    return [(math.prod(s[:n]), math.prod(s[n:]))]
  if rule.kind == "fused_kernel":
    return [(s[0], sum(math.prod(x[1:]) for x in shapes))]
  if rule.kind == "fused_linear":
    return [(sum(math.prod(x[1:]) for x in shapes), s[0])]
  if rule.kind == "fused_bias":
    return [(sum(math.prod(x) for x in shapes),)]
  if rule.kind == "patch":
    P, C = rule.patch
    return [(s[1], C, P, P)]
  if rule.kind == "batch1":
    return [(1,) + s]
  raise AssertionError(rule.kind)


def to_ours(rule: Rule, arrays: list[np.ndarray], shapes: list[tuple]) -> list[np.ndarray]:
  if rule.kind == "experts":
    return [np.stack([a.T for a in arrays])]
  if rule.kind in ("gate_up", "gate_up_bias"):  # even columns the gate, odd ones up
    (a,) = arrays
    return [a[..., 0::2].reshape(shapes[0]), a[..., 1::2].reshape(shapes[1])]
  if rule.kind == "gate_up_halves":  # the first half of the columns the gate, the second up
    (a,) = arrays
    return [a[..., : a.shape[-1] // 2], a[..., a.shape[-1] // 2 :]]
  (a,) = arrays
  if rule.kind == "expert_bias":
    return [a.reshape(shapes[0])]
  if rule.kind in ("copy", "bias", "conv1d", "batch1"):
    return [a.reshape(shapes[0])]
  if rule.kind == "linear":
    return [(a[np.asarray(rule.rows)] if rule.rows else a).T.reshape(shapes[0])]
  if rule.kind == "fused_linear":
    a = a.T
  if rule.kind in ("fused_kernel", "fused_bias", "fused_linear"):
    widths = [math.prod(x if rule.kind == "fused_bias" else x[1:]) for x in shapes]
    parts = np.split(a, np.cumsum(widths)[:-1], axis=-1)
    return [p.reshape(x) for p, x in zip(parts, shapes)]
  if rule.kind == "patch":  # [D, C, P, P] -> [P (row), P (col), C, D] -> [P*P*C, D]
    return [a.transpose(2, 3, 1, 0).reshape(shapes[0])]
  raise AssertionError(rule.kind)


def to_hf(rule: Rule, arrays: list[np.ndarray]) -> list[np.ndarray]:
  a, n = arrays[0], rule.n_in
  if rule.kind == "copy":
    return [a]
  if rule.kind == "bias":
    return [a.reshape(-1)]
  if rule.kind == "linear":
    out = a.reshape(math.prod(a.shape[:n]), -1).T
    return [out[np.argsort(rule.rows)] if rule.rows else out]
  if rule.kind == "conv1d":
    return [a.reshape(math.prod(a.shape[:n]), -1)]
  if rule.kind == "fused_kernel":
    return [np.concatenate([x.reshape(x.shape[0], -1) for x in arrays], axis=-1)]
  if rule.kind == "fused_linear":
    return [np.concatenate([x.reshape(x.shape[0], -1) for x in arrays], axis=-1).T]
  if rule.kind == "fused_bias":
    return [np.concatenate([x.reshape(-1) for x in arrays])]
  if rule.kind == "patch":
    P, C = rule.patch
    return [a.reshape(P, P, C, a.shape[1]).transpose(3, 2, 0, 1)]
  if rule.kind == "batch1":
    return [a[None]]
  if rule.kind == "experts":
    return [x.T for x in a]
  if rule.kind in ("gate_up", "gate_up_bias"):
    gate, up = (x.reshape(x.shape[0], -1, x.shape[-1]) for x in arrays)
    both = np.stack([gate, up], axis=-1).reshape(gate.shape[:-1] + (-1,))
    return [both if rule.kind == "gate_up" else both[:, 0]]
  if rule.kind == "expert_bias":
    return [a.reshape(a.shape[0], -1)]
  if rule.kind == "gate_up_halves":
    return [np.concatenate(arrays, axis=-1)]
  raise AssertionError(rule.kind)


def linear(hf: str, path: tuple, n_in: int = 1, rows: tuple = (), bias: bool = False) -> list[Rule]:
  """Torch Linear `hf` <-> our kernel at `path` (rows in `rows`' order); its bias with `bias`."""
  rules = [Rule("linear", (hf + ".weight",), (path + ("kernel",),), n_in, rows=rows)]
  if bias:
    rules.append(Rule("bias", (hf + ".bias",), (path + ("bias",),)))
  return rules


PRE_NORMS = (("input_layernorm", "self_attn_norm"), ("post_attention_layernorm", "ffn_norm"))


def decoder_rules(c: ModelConfig, base: str, block_rules, norms=PRE_NORMS, after_blocks=()):
  """A Llama-layout decoder: embedding; per block h=`<base>layers.<i>.`, ours=decoder/layer_<i>:
  `norms` (torch, ours) then block_rules(i, h, ours); `after_blocks`; final norm; untied lm_head."""
  rules = [Rule("copy", (base + "embed_tokens.weight",), (("embed", "token_embed", "embedding"),))]
  for i in range(c.num_layers):
    h, ours = f"{base}layers.{i}.", ("decoder", f"layer_{i}")
    for hf_name, name in norms:
      rules.append(Rule("copy", (h + hf_name + ".weight",), (ours + (name, "scale"),)))
    rules += block_rules(i, h, ours)
  rules += after_blocks
  rules.append(Rule("copy", (base + "norm.weight",), (("final_norm", "scale"),)))
  if not c.tie_embeddings:
    rules.append(Rule("linear", ("lm_head.weight",), (("lm_head", "kernel"),)))
  return rules


def dense(hf: str, path: tuple[str, ...], kind: str = "linear", n_in: int = 1) -> list[Rule]:
  return [
      Rule(kind, (hf + ".weight",), (path + ("kernel",),), n_in),
      Rule("bias", (hf + ".bias",), (path + ("bias",),)),
  ]


def norm(hf: str, path: tuple[str, ...]) -> list[Rule]:
  return [
      Rule("copy", (hf + ".weight",), (path + ("scale",),)),
      Rule("copy", (hf + ".bias",), (path + ("bias",),)),
  ]


def encoder_layer_rules(
    c: ModelConfig, prefix: str, attention: str, norms: tuple[str, str]
) -> list[Rule]:
  """The `encoder.layer.{i}` tensors BERT and ViT share: q, k, v under `attention`
  ("attention.self." or "attention.attention."), the output and FFN dense layers, and the two
  norms named `norms` (before or after attention, then the FFN's), in order."""
  rules = []
  for i in range(c.num_layers):
    h, ours = f"{prefix}encoder.layer.{i}.", ("encoder", f"layer_{i}")
    attn = ours + ("self_attn",)
    for p in ("query", "key", "value"):
      rules += dense(h + attention + p, attn + (p,))
    rules += dense(h + "attention.output.dense", attn + ("out",), n_in=2)
    rules += dense(h + "intermediate.dense", ours + ("ffn", "wi"))
    rules += dense(h + "output.dense", ours + ("ffn", "wo"))
    rules += norm(h + norms[0], ours + ("self_attn_norm",))
    rules += norm(h + norms[1], ours + ("ffn_norm",))
  return rules


def get(hf: Mapping, *names, default=None):
  for n in names:
    if hf.get(n) is not None:
      return hf[n]
  return default


def activation(hf: Mapping, key: str, where: str) -> str:
  name = hf.get(key, "gelu")
  if name not in ACTIVATIONS_IN:
    raise UnsupportedArchitecture(
        f"{where}: {key}={name!r} is not supported: use one of {', '.join(ACTIVATIONS_IN)}"
    )
  return ACTIVATIONS_IN[name]


def require(hf: Mapping, where: str, **expected) -> None:
  for key, want in expected.items():
    if key in hf and hf[key] is not None and hf[key] != want:
      raise UnsupportedArchitecture(
          f"{where}: {key}={hf[key]!r} is not supported (only {want!r} maps onto our blocks)"
      )


def decoder_shape(hf: Mapping) -> dict[str, Any]:
  """ModelConfig fields of the keys a Llama-like config.json gives its shape (and GQA) in."""
  heads = hf["num_attention_heads"]
  return dict(
      num_layers=hf["num_hidden_layers"],
      d_model=hf["hidden_size"],
      num_heads=heads,
      num_kv_heads=get(hf, "num_key_value_heads", default=heads),
      head_dim=get(hf, "head_dim", default=hf["hidden_size"] // heads),
      d_ff=hf["intermediate_size"],
      vocab_size=hf["vocab_size"],
      max_len=hf["max_position_embeddings"],
  )


# The `requirements` every Llama-layout decoder (RoPE, pre-norm RMSNorm blocks) starts from.
ROPE_DECODER = dict(
    family="decoder",
    norm_placement="pre",
    has_final_norm=True,
    embed_norm=False,
    type_vocab_size=0,
    positions="rope",
    norm="rmsnorm",
    has_norm_bias=False,
)


# BertConfig and ViTConfig share these keys (and defaults) for the encoder stack.
ENCODER_DEFAULTS = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    initializer_range=0.02,
    layer_norm_eps=1e-12,
)


# The encoder-stack keys quoted (with the family's own) when a tensor's shape disagrees.
ENCODER_SUMMARY_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
)


def encoder_fields(hf: Mapping, where: str) -> dict[str, Any]:
  """ModelConfig fields of the encoder-stack keys BERT and ViT configs share."""
  return dict(
      num_layers=hf["num_hidden_layers"],
      d_model=hf["hidden_size"],
      num_heads=hf["num_attention_heads"],
      d_ff=hf["intermediate_size"],
      positions="learned",
      norm="layernorm",
      norm_eps=hf["layer_norm_eps"],
      activation=activation(hf, "hidden_act", where),
      use_bias=True,
      dropout=hf["hidden_dropout_prob"],
      attention_dropout=hf["attention_probs_dropout_prob"],
      init_std=hf["initializer_range"],
  )


def encoder_hf_config(c: ModelConfig) -> dict[str, Any]:
  """The encoder-stack keys of a BERT or ViT config.json for `c`."""
  return dict(
      hidden_size=c.d_model,
      num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads,
      intermediate_size=c.ff_width,
      hidden_act=ACTIVATIONS_OUT[c.activation],
      layer_norm_eps=c.norm_eps,
      hidden_dropout_prob=c.dropout,
      attention_probs_dropout_prob=c.attention_dropout,
      initializer_range=c.init_std,
  )


class Family:
  """One Hugging Face model type (GPT-2, BERT, ViT …): how its config.json and tensors map onto
  a ModelConfig and our parameter tree. Subclasses fill in the class attributes and methods."""

  model_type = ""  # config.json's model_type
  architectures: Mapping[str, tuple[str, ...]] = {}  # architecture -> the heads it can hold
  base_prefix: Mapping[str, str] = {}  # architecture -> prefix of its base model's tensors
  load_prefix = ""  # stripped from tensor names on load (the base model of a head class)
  defaults: Mapping[str, Any] = {}  # what the reference config class assumes for a missing key
  aliases: Mapping[str, str] = {}  # generic config names that stand for this type's own
  summary_keys: tuple[str, ...] = ()  # config.json keys quoted in shape-mismatch messages
  explicit_head_dim = False  # config.json can give a head width other than d_model / heads

  def config(self, hf: Mapping) -> dict:
    """config.json with aliases resolved and missing keys at the reference defaults."""
    given = {k: v for k, v in hf.items() if v is not None}
    for alias, name in self.aliases.items():
      if alias in given and name not in given:
        given[name] = given.pop(alias)
    return {**self.defaults, **given}

  def fields(self, hf: Mapping, architecture: str, where: str) -> dict[str, Any]:
    """ModelConfig fields of a config.json (already through `config`)."""
    raise NotImplementedError

  def hf_config(self, c: ModelConfig, architecture: str) -> dict[str, Any]:
    """The config.json entries (besides architectures, model_type, dtype) that describe `c`."""
    raise NotImplementedError

  def rules(self, c: ModelConfig, base: str) -> list[Rule]:
    """How each tensor maps, with `base` before the base model's tensor names."""
    raise NotImplementedError

  def ignorable(self, c: ModelConfig) -> list[str]:
    """Patterns of tensor names a checkpoint may hold that carry nothing we need."""
    return []

  def default_architecture(self, c: ModelConfig) -> str | None:
    """The architecture a model of this family and head is written as (None: none fits)."""
    return None

  def requirements(self, c: ModelConfig, architecture: str) -> dict[str, Any]:
    """ModelConfig attributes this architecture needs (a value or a tuple of allowed ones)."""
    return {}

  def check_exportable(self, c: ModelConfig, architecture: str) -> None:
    """Refuse (UnsupportedConfig) what `requirements` cannot say."""

  def adjust_loaded(self, tensors: dict, fields: dict) -> None:
    """Fix up tensor names or fields after loading (in place)."""

  def adjust_saved(self, tensors: dict, c: ModelConfig) -> None:
    """Add what the written files need beyond the rules (in place)."""

  def summary(self, hf: Mapping) -> str:
    return ", ".join(f"{k}={hf[k]}" for k in self.summary_keys if k in hf)
