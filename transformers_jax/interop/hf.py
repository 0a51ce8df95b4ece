"""Hugging Face checkpoints of GPT-2, BERT and ViT <-> our config fields and parameter trees.

    fields, params = load_hf("path/to/gpt2")          # config.json + model.safetensors (or shards)
    model = build_model(fields); model.apply({"params": params}, tokens)
    save_hf("path/to/out", fields, params)            # loadable by transformers' from_pretrained

Only numpy and `safetensors.numpy` are used: no torch, no transformers, no pickle files.

Architectures: GPT2LMHeadModel / GPT2Model (decoder, pre-LN, `lm` head tied to the token embedding
unless tie_word_embeddings is false), BertModel / BertForMaskedLM (encoder, post-LN with the
embedding norm, `pooler` / `mlm` head), ViTModel / ViTForImageClassification (vit, pre-LN, class
token, `pooler` (or `none` when the checkpoint has no pooler) / `classifier` head).

Layouts. Parameters come back unscanned (`layer_0` … `layer_{L-1}`; `loop_to_scan` from
modules/block.py gives the `scan_layers` layout). torch Linear weights are [out, in] and are
transposed; GPT-2's Conv1D weights are already [in, out] and its fused `c_attn` is split into
query, key and value; attention kernels are reshaped to [D, H, K] and [H, K, D]; ViT's patch
convolution [D, C, P, P] becomes the `patch_embed` kernel over patches flattened in (row, col,
channel) order, as `patchify` lays them out; ViT's [1, N, D] position table loses its batch axis.

Every problem raises an `HFCheckpointError` (a ValueError) with one line naming the problem and
the fix: an unsupported architecture or option, a missing or unreadable file, a missing,
unexpected or wrongly shaped tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
from typing import Any
from collections.abc import Mapping

import numpy as np

from transformers_jax.config import ModelConfig

SUPPORTED_ARCHITECTURES = {
    "GPT2LMHeadModel": "gpt2",
    "GPT2Model": "gpt2",
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
    "ViTModel": "vit",
    "ViTForImageClassification": "vit",
}
# The prefix under which each architecture stores its base model's tensors.
BASE_PREFIX = {
    "GPT2LMHeadModel": "transformer.",
    "BertForMaskedLM": "bert.",
    "ViTForImageClassification": "vit.",
}
MODEL_TYPE_DEFAULT = {"gpt2": "GPT2LMHeadModel", "bert": "BertModel", "vit": "ViTModel"}
ACTIVATIONS_IN = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
ACTIVATIONS_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


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
  (GPT-2 c_attn <-> query, key, value); patch (conv [D, C, P, P] <-> [P*P*C, D]); batch1
  ([1, N, D] <-> [N, D]). `patch` holds (P, C) for the patch kind.
  """

  kind: str
  hf: tuple[str, ...]
  ours: tuple[tuple[str, ...], ...]
  n_in: int = 1
  patch: tuple[int, int] = (0, 0)


def _hf_shapes(rule: Rule, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
  s = shapes[0]
  n = rule.n_in
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
  if rule.kind == "fused_bias":
    return [(sum(math.prod(x) for x in shapes),)]
  if rule.kind == "patch":
    P, C = rule.patch
    return [(s[1], C, P, P)]
  if rule.kind == "batch1":
    return [(1,) + s]
  raise AssertionError(rule.kind)


def _to_ours(rule: Rule, arrays: list[np.ndarray], shapes: list[tuple]) -> list[np.ndarray]:
  (a,) = arrays
  if rule.kind in ("copy", "bias", "conv1d", "batch1"):
    return [a.reshape(shapes[0])]
  if rule.kind == "linear":
    return [a.T.reshape(shapes[0])]
  if rule.kind in ("fused_kernel", "fused_bias"):
    widths = [math.prod(x[1:] if rule.kind == "fused_kernel" else x) for x in shapes]
    parts = np.split(a, np.cumsum(widths)[:-1], axis=-1)
    return [p.reshape(x) for p, x in zip(parts, shapes)]
  if rule.kind == "patch":  # [D, C, P, P] -> [P (row), P (col), C, D] -> [P*P*C, D]
    return [a.transpose(2, 3, 1, 0).reshape(shapes[0])]
  raise AssertionError(rule.kind)


def _to_hf(rule: Rule, arrays: list[np.ndarray]) -> list[np.ndarray]:
  a, n = arrays[0], rule.n_in
  if rule.kind == "copy":
    return [a]
  if rule.kind == "bias":
    return [a.reshape(-1)]
  if rule.kind == "linear":
    return [a.reshape(math.prod(a.shape[:n]), -1).T]
  if rule.kind == "conv1d":
    return [a.reshape(math.prod(a.shape[:n]), -1)]
  if rule.kind == "fused_kernel":
    return [np.concatenate([x.reshape(x.shape[0], -1) for x in arrays], axis=-1)]
  if rule.kind == "fused_bias":
    return [np.concatenate([x.reshape(-1) for x in arrays])]
  if rule.kind == "patch":
    P, C = rule.patch
    return [a.reshape(P, P, C, a.shape[1]).transpose(3, 2, 0, 1)]
  if rule.kind == "batch1":
    return [a[None]]
  raise AssertionError(rule.kind)


def _dense(hf: str, path: tuple[str, ...], kind: str = "linear", n_in: int = 1) -> list[Rule]:
  return [
      Rule(kind, (hf + ".weight",), (path + ("kernel",),), n_in),
      Rule("bias", (hf + ".bias",), (path + ("bias",),)),
  ]


def _norm(hf: str, path: tuple[str, ...]) -> list[Rule]:
  return [
      Rule("copy", (hf + ".weight",), (path + ("scale",),)),
      Rule("copy", (hf + ".bias",), (path + ("bias",),)),
  ]


def _gpt2_rules(c: ModelConfig, base: str) -> list[Rule]:
  rules = [
      Rule("copy", (base + "wte.weight",), (("embed", "token_embed", "embedding"),)),
      Rule("copy", (base + "wpe.weight",), (("embed", "pos_embed", "embedding"),)),
  ]
  for i in range(c.num_layers):
    h, ours = f"{base}h.{i}.", ("decoder", f"layer_{i}")
    attn = ours + ("self_attn",)
    rules += _norm(h + "ln_1", ours + ("self_attn_norm",))
    rules.append(
        Rule(
            "fused_kernel",
            (h + "attn.c_attn.weight",),
            tuple(attn + (p, "kernel") for p in ("query", "key", "value")),
        )
    )
    rules.append(
        Rule(
            "fused_bias",
            (h + "attn.c_attn.bias",),
            tuple(attn + (p, "bias") for p in ("query", "key", "value")),
        )
    )
    rules += _dense(h + "attn.c_proj", attn + ("out",), "conv1d", n_in=2)
    rules += _norm(h + "ln_2", ours + ("ffn_norm",))
    rules += _dense(h + "mlp.c_fc", ours + ("ffn", "wi"), "conv1d")
    rules += _dense(h + "mlp.c_proj", ours + ("ffn", "wo"), "conv1d")
  rules += _norm(base + "ln_f", ("final_norm",))
  if not c.tie_embeddings:
    rules.append(Rule("linear", ("lm_head.weight",), (("lm_head", "kernel"),)))
  return rules


def _encoder_layer_rules(c: ModelConfig, prefix: str, vit: bool) -> list[Rule]:
  rules = []
  for i in range(c.num_layers):
    h, ours = f"{prefix}encoder.layer.{i}.", ("encoder", f"layer_{i}")
    attn = ours + ("self_attn",)
    qkv = "attention.attention." if vit else "attention.self."
    for p in ("query", "key", "value"):
      rules += _dense(h + qkv + p, attn + (p,))
    rules += _dense(h + "attention.output.dense", attn + ("out",), n_in=2)
    rules += _dense(h + "intermediate.dense", ours + ("ffn", "wi"))
    rules += _dense(h + "output.dense", ours + ("ffn", "wo"))
    if vit:
      rules += _norm(h + "layernorm_before", ours + ("self_attn_norm",))
      rules += _norm(h + "layernorm_after", ours + ("ffn_norm",))
    else:
      rules += _norm(h + "attention.output.LayerNorm", ours + ("self_attn_norm",))
      rules += _norm(h + "output.LayerNorm", ours + ("ffn_norm",))
  return rules


def _bert_rules(c: ModelConfig, base: str) -> list[Rule]:
  e = base + "embeddings."
  rules = [
      Rule("copy", (e + "word_embeddings.weight",), (("embed", "token_embed", "embedding"),)),
      Rule("copy", (e + "position_embeddings.weight",), (("embed", "pos_embed", "embedding"),)),
      Rule("copy", (e + "token_type_embeddings.weight",), (("embed", "type_embed", "embedding"),)),
  ]
  rules += _norm(e + "LayerNorm", ("embed", "embed_norm"))
  rules += _encoder_layer_rules(c, base, vit=False)
  if c.head_kind == "pooler":
    rules += _dense(base + "pooler.dense", ("pooler",))
  if c.head_kind == "mlm":
    rules += _dense("cls.predictions.transform.dense", ("mlm_transform",))
    rules += _norm("cls.predictions.transform.LayerNorm", ("mlm_norm",))
    rules.append(Rule("copy", ("cls.predictions.bias",), (("mlm_bias",),)))
    if not c.tie_embeddings:
      rules.append(
          Rule("linear", ("cls.predictions.decoder.weight",), (("mlm_decoder", "kernel"),))
      )
  return rules


def _vit_rules(c: ModelConfig, base: str) -> list[Rule]:
  e = base + "embeddings."
  rules = [
      Rule("copy", (e + "cls_token",), (("cls_token",),)),
      Rule("batch1", (e + "position_embeddings",), (("embed", "pos_embed", "embedding"),)),
      Rule(
          "patch",
          (e + "patch_embeddings.projection.weight",),
          (("patch_embed", "kernel"),),
          patch=(c.patch_size, c.num_channels),
      ),
      Rule("copy", (e + "patch_embeddings.projection.bias",), (("patch_embed", "bias"),)),
  ]
  rules += _encoder_layer_rules(c, base, vit=True)
  rules += _norm(base + "layernorm", ("final_norm",))
  if c.head_kind == "pooler":
    rules += _dense(base + "pooler.dense", ("pooler",))
  if c.head_kind == "classifier":
    rules += _dense("classifier", ("classifier",))
  return rules


def _rules(c: ModelConfig, architecture: str, base: str) -> list[Rule]:
  family = SUPPORTED_ARCHITECTURES[architecture]
  return {"gpt2": _gpt2_rules, "bert": _bert_rules, "vit": _vit_rules}[family](c, base)


# Tensors a checkpoint may hold that carry nothing we need (names after the base prefix is removed):
# GPT-2's old causal-mask buffers, BERT's position_ids buffer and next-sentence head, the pooler of
# a BertForPreTraining checkpoint read as BertForMaskedLM, tied copies of the token embedding.
def _ignorable(c: ModelConfig) -> re.Pattern:
  patterns = [
      r"h\.\d+\.attn\.(masked_)?bias",
      r"embeddings\.position_ids",
      r"cls\.seq_relationship\..*",
  ]
  if c.head_kind == "mlm":
    patterns.append(r"pooler\.dense\.(weight|bias)")
    patterns.append(r"cls\.predictions\.decoder\.bias")  # HF ties it to cls.predictions.bias
  if c.tie_embeddings:
    patterns += [r"lm_head\.weight", r"cls\.predictions\.decoder\.weight"]
  return re.compile("|".join(f"(?:{p})" for p in patterns))


# ----------------------------------------------------------------------------- configs
def _get(hf: Mapping, *names, default=None):
  for n in names:
    if hf.get(n) is not None:
      return hf[n]
  return default


def _activation(hf: Mapping, key: str, where: str) -> str:
  name = hf.get(key, "gelu")
  if name not in ACTIVATIONS_IN:
    raise UnsupportedArchitecture(
        f"{where}: {key}={name!r} is not supported: use one of {', '.join(ACTIVATIONS_IN)}"
    )
  return ACTIVATIONS_IN[name]


def _require(hf: Mapping, where: str, **expected) -> None:
  for key, want in expected.items():
    if key in hf and hf[key] is not None and hf[key] != want:
      raise UnsupportedArchitecture(
          f"{where}: {key}={hf[key]!r} is not supported (only {want!r} maps onto our blocks)"
      )


# What transformers' config classes assume for a key config.json leaves out (GPT2Config,
# BertConfig, ViTConfig): a missing key means the reference library's default, as it loads it.
HF_DEFAULTS = {
    "gpt2": dict(
        vocab_size=50257,
        n_positions=1024,
        n_embd=768,
        n_layer=12,
        n_head=12,
        n_inner=None,
        activation_function="gelu_new",
        resid_pdrop=0.1,
        attn_pdrop=0.1,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=True,
    ),
    "bert": dict(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=2,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        tie_word_embeddings=True,
    ),
    "vit": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        image_size=224,
        patch_size=16,
        num_channels=3,
        qkv_bias=True,
    ),
}


def _fields_from_hf(hf: Mapping, architecture: str, where: str) -> dict[str, Any]:
  family = SUPPORTED_ARCHITECTURES[architecture]
  given = {k: v for k, v in hf.items() if v is not None}
  if family == "gpt2":  # GPT2Config's attribute_map: the generic names stand for its own
    for alias, name in (
        ("hidden_size", "n_embd"),
        ("max_position_embeddings", "n_positions"),
        ("num_attention_heads", "n_head"),
        ("num_hidden_layers", "n_layer"),
    ):
      if alias in given and name not in given:
        given[name] = given.pop(alias)
  hf = {**HF_DEFAULTS[family], **given}
  if family == "gpt2":
    _require(
        hf,
        where,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        add_cross_attention=False,
    )
    d = _get(hf, "n_embd", "hidden_size")
    return dict(
        family="decoder",
        num_layers=_get(hf, "n_layer", "num_hidden_layers"),
        d_model=d,
        num_heads=_get(hf, "n_head", "num_attention_heads"),
        d_ff=_get(hf, "n_inner", default=4 * d),
        vocab_size=hf["vocab_size"],
        max_len=_get(hf, "n_positions", "max_position_embeddings"),
        positions="learned",
        norm_placement="pre",
        norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=_activation(hf, "activation_function", where),
        use_bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        head="lm",
        dropout=hf.get("resid_pdrop", 0.1),
        attention_dropout=hf.get("attn_pdrop", 0.1),
        init_std=hf.get("initializer_range", 0.02),
    )
  common = dict(
      num_layers=hf["num_hidden_layers"],
      d_model=hf["hidden_size"],
      num_heads=hf["num_attention_heads"],
      d_ff=hf["intermediate_size"],
      positions="learned",
      norm="layernorm",
      norm_eps=hf.get("layer_norm_eps", 1e-12),
      activation=_activation(hf, "hidden_act", where),
      use_bias=True,
      dropout=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
      init_std=hf.get("initializer_range", 0.02),
  )
  if family == "bert":
    _require(
        hf, where, position_embedding_type="absolute", is_decoder=False, add_cross_attention=False
    )
    return dict(
        family="encoder",
        **common,
        vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        norm_placement="post",
        embed_norm=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        head="mlm" if architecture == "BertForMaskedLM" else "pooler",
    )
  _require(hf, where, qkv_bias=True, pooler_act="tanh", pooler_output_size=hf["hidden_size"])
  image, patch = hf.get("image_size", 224), hf.get("patch_size", 16)
  for key, value in (("image_size", image), ("patch_size", patch)):
    if isinstance(value, (list, tuple)):
      if len(set(value)) != 1:
        raise UnsupportedArchitecture(
            f"{where}: {key}={value} is not square: only square " "images and patches are supported"
        )
      value = value[0]
    if key == "image_size":
      image = value
    else:
      patch = value
  fields = dict(
      family="vit",
      **common,
      image_size=image,
      patch_size=patch,
      num_channels=hf.get("num_channels", 3),
      pool="cls",
      norm_placement="pre",
      head="pooler",
  )
  if architecture == "ViTForImageClassification":
    labels = hf.get("id2label")
    fields.update(head="classifier", num_classes=len(labels) if labels else hf.get("num_labels", 2))
  return fields


def _hf_from_config(c: ModelConfig, architecture: str, dtype: str) -> dict[str, Any]:
  family = SUPPORTED_ARCHITECTURES[architecture]
  act = ACTIVATIONS_OUT[c.activation]
  out: dict[str, Any] = {"architectures": [architecture], "model_type": family, "dtype": dtype}
  if family == "gpt2":
    # GPT-2's bos/eos default to 50256; a smaller vocabulary has no such token.
    eos = 50256 if c.vocab_size > 50256 else None
    out.update(
        vocab_size=c.vocab_size,
        n_positions=c.max_len,
        n_embd=c.d_model,
        n_layer=c.num_layers,
        n_head=c.num_heads,
        n_inner=c.ff_width,
        activation_function=act,
        layer_norm_epsilon=c.norm_eps,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attention_dropout,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=eos,
        eos_token_id=eos,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
    )
    return out
  out.update(
      hidden_size=c.d_model,
      num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads,
      intermediate_size=c.ff_width,
      hidden_act=act,
      layer_norm_eps=c.norm_eps,
      hidden_dropout_prob=c.dropout,
      attention_probs_dropout_prob=c.attention_dropout,
      initializer_range=c.init_std,
  )
  if family == "bert":
    out.update(
        vocab_size=c.vocab_size,
        max_position_embeddings=c.max_len,
        type_vocab_size=c.type_vocab_size,
        tie_word_embeddings=c.tie_embeddings,
        position_embedding_type="absolute",
        is_decoder=False,
        pad_token_id=0,
    )
    return out
  out.update(
      image_size=c.image_size,
      patch_size=c.patch_size,
      num_channels=c.num_channels,
      qkv_bias=True,
      pooler_act="tanh",
      pooler_output_size=c.d_model,
      encoder_stride=c.patch_size,
  )
  if c.head_kind == "classifier":
    out["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.num_classes)}
    out["label2id"] = {f"LABEL_{i}": i for i in range(c.num_classes)}
  return out


def _default_architecture(c: ModelConfig) -> str:
  if c.family == "decoder":
    return "GPT2LMHeadModel"
  if c.family == "encoder":
    return {"pooler": "BertModel", "mlm": "BertForMaskedLM"}.get(c.head_kind, "")
  if c.family == "vit":
    return {"classifier": "ViTForImageClassification"}.get(c.head_kind, "ViTModel")
  return ""


def _check_exportable(c: ModelConfig, architecture: str) -> None:
  """Raise UnsupportedConfig naming the first field that the HF architecture cannot express."""
  family = SUPPORTED_ARCHITECTURES[architecture]
  heads = {
      "GPT2LMHeadModel": ("lm",),
      "GPT2Model": ("lm",),
      "BertModel": ("pooler",),
      "BertForMaskedLM": ("mlm",),
      "ViTModel": ("pooler", "none"),
      "ViTForImageClassification": ("classifier",),
  }[architecture]
  want = dict(
      family={"gpt2": "decoder", "bert": "encoder", "vit": "vit"}[family],
      head_kind=heads,
      positions="learned",
      norm="layernorm",
      norm_scale=True,
      has_norm_bias=True,
      use_bias=True,
      residual=True,
      feed_forward="dense",
      embed_scale=False,
      kv_heads=c.num_heads,
      activation=tuple(ACTIVATIONS_OUT),
      norm_placement="post" if family == "bert" else "pre",
      has_final_norm=family != "bert",
      embed_norm=family == "bert",
  )
  if family == "vit":
    want["pool"] = "cls"
  if family != "bert":
    want["type_vocab_size"] = 0
  if architecture == "GPT2Model":
    want["tie_embeddings"] = True  # GPT2Model has no lm_head to hold an untied unembedding
  for field, value in want.items():
    have = getattr(c, field)
    if have not in (value if isinstance(value, tuple) else (value,)):
      raise UnsupportedConfig(
          f"cannot write model.{field}={have!r} as {architecture} (which needs "
          f"{' or '.join(map(repr, value)) if isinstance(value, tuple) else repr(value)}): "
          "change the config or pick another architecture"
      )
  if c.head_width * c.num_heads != c.d_model:
    raise UnsupportedConfig(
        f"cannot write model.head_dim={c.head_width} as {architecture}: Hugging Face uses "
        f"d_model / num_heads = {c.d_model / c.num_heads:g}; leave model.head_dim unset"
    )
  if family == "bert" and c.type_vocab_size < 1:
    raise UnsupportedConfig(
        f"cannot write model.type_vocab_size=0 as {architecture}: BERT always has token types; "
        "set model.type_vocab_size >= 1"
    )


# ----------------------------------------------------------------------------- files
def _read_json(path: pathlib.Path, what: str) -> dict:
  try:
    return json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CorruptCheckpoint(
        f"{path}: {what} is not valid JSON ({e}): re-download or re-save " "the checkpoint"
    ) from None


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file

  if not path.is_file():
    raise MissingCheckpointFile(
        f"{path} does not exist: the checkpoint is incomplete; " "re-download or re-save it"
    )
  try:
    return load_file(str(path))
  except Exception as e:  # safetensors raises its own SafetensorError (an Exception subclass)
    raise CorruptCheckpoint(
        f"{path} is not a readable safetensors file ({e}): it is truncated or "
        "corrupt; re-download or re-save it"
    ) from None


def _read_tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
  if (directory / WEIGHTS).is_file():
    return _read_safetensors(directory / WEIGHTS)
  if (directory / INDEX).is_file():
    index = _read_json(directory / INDEX, "the shard index")
    if not isinstance(index.get("weight_map"), dict):
      raise CorruptCheckpoint(f"{directory / INDEX} has no weight_map: re-save the checkpoint")
    tensors: dict[str, np.ndarray] = {}
    root = directory.resolve()
    for shard in sorted(set(index["weight_map"].values())):
      path = (directory / str(shard)).resolve()
      if root not in path.parents:
        raise CorruptCheckpoint(
            f"{directory / INDEX} names the shard {shard!r}, which lies "
            "outside the model folder: only files inside it are read; "
            "re-save the checkpoint"
        )
      tensors.update(_read_safetensors(path))
    return tensors
  others = sorted(
      p.name
      for p in directory.iterdir()
      if p.suffix in (".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")
  )
  found = (
      (f" (found {', '.join(others)}, which is not read: pickle and framework files are " "unsafe)")
      if others
      else ""
  )
  raise MissingCheckpointFile(
      f"{directory}: no {WEIGHTS} or {INDEX}{found}: save the model with "
      "save_pretrained(..., safe_serialization=True)"
  )


def _architecture(hf: Mapping, directory: pathlib.Path) -> str:
  names = list(hf.get("architectures") or [])
  for name in names:
    if name in SUPPORTED_ARCHITECTURES:
      return name
  model_type = hf.get("model_type")
  if not names and model_type in MODEL_TYPE_DEFAULT:
    return MODEL_TYPE_DEFAULT[model_type]
  found = ", ".join(names) if names else f"model_type={model_type!r}"
  raise UnsupportedArchitecture(
      f"{directory}: config.json describes {found}, which cannot be imported: supported "
      f"architectures are {', '.join(SUPPORTED_ARCHITECTURES)}"
  )


def _strip(name: str, prefix: str) -> str:
  name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)  # original BERT checkpoints
  name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
  return name[len(prefix) :] if prefix and name.startswith(prefix) else name


def _flat_shapes(tree, prefix=()) -> dict[tuple[str, ...], tuple[int, ...]]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(_flat_shapes(value, prefix + (key,)))
    else:
      out[prefix + (key,)] = tuple(value.shape)
  return out


def _nest(flat: Mapping[tuple[str, ...], Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def _expected_shapes(c: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  from transformers_jax.models import param_shapes

  return _flat_shapes(param_shapes(c.replace(scan_layers=False, remat="none")))


def _summary(hf: Mapping, family: str) -> str:
  keys = {
      "gpt2": ("n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "n_positions"),
      "bert": (
          "num_hidden_layers",
          "hidden_size",
          "num_attention_heads",
          "intermediate_size",
          "vocab_size",
          "max_position_embeddings",
          "type_vocab_size",
      ),
      "vit": (
          "num_hidden_layers",
          "hidden_size",
          "num_attention_heads",
          "intermediate_size",
          "image_size",
          "patch_size",
          "num_channels",
      ),
  }[family]
  return ", ".join(f"{k}={hf[k]}" for k in keys if k in hf)


# ----------------------------------------------------------------------------- public API
def load_hf(directory, dtype: str = "float32") -> tuple[dict[str, Any], dict]:
  """Read a local Hugging Face model directory -> (ModelConfig fields, unscanned params).

  The parameters are numpy arrays of `dtype` (recorded as the fields' `param_dtype`); the tree
  matches `param_shapes(ModelConfig(**fields))`.
  """
  from transformers_jax.config import DTYPES
  from transformers_jax.modules.common import dtype_of

  directory = pathlib.Path(directory)
  if dtype not in DTYPES:
    raise ValueError(f"dtype={dtype!r}: choose one of {', '.join(DTYPES)}")
  if not directory.is_dir():
    raise MissingCheckpointFile(
        f"{directory} is not a directory: pass the folder that holds "
        "config.json and model.safetensors"
    )
  if not (directory / "config.json").is_file():
    raise MissingCheckpointFile(
        f"{directory}: no config.json: pass a directory written by "
        "save_pretrained (or save_hf), which holds config.json"
    )
  hf = _read_json(directory / "config.json", "config.json")
  architecture = _architecture(hf, directory)
  family = SUPPORTED_ARCHITECTURES[architecture]
  try:
    fields = _fields_from_hf(hf, architecture, f"{directory}/config.json")
  except KeyError as e:
    raise CorruptCheckpoint(
        f"{directory}/config.json has no {e.args[0]!r}, which {architecture} "
        "needs: use the config.json saved with the weights"
    ) from None
  prefix = {"gpt2": "transformer.", "bert": "bert.", "vit": "vit."}[family]
  tensors = {_strip(k, prefix): v for k, v in _read_tensors(directory).items()}
  for name, array in tensors.items():
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
      raise CorruptCheckpoint(
          f"{directory}: tensor {_full_name(name, architecture)} holds NaN "
          "or infinite values: the checkpoint is damaged or diverged; use "
          "another one"
      )
  if family == "vit" and fields["head"] == "pooler" and "pooler.dense.weight" not in tensors:
    fields["head"] = "none"  # a ViTModel saved without its pooler
  # The MLM output bias: `cls.predictions.bias`, which the decoder shares when tied; an untied
  # decoder (tie_word_embeddings=False) adds its own `decoder.bias`, the one its logits use.
  untied = not fields.get("tie_embeddings", True)
  if "cls.predictions.decoder.bias" in tensors and (
      untied or "cls.predictions.bias" not in tensors
  ):
    tensors["cls.predictions.bias"] = tensors.pop("cls.predictions.decoder.bias")
  fields["param_dtype"] = dtype
  try:
    c = ModelConfig(**fields)
  except ValueError as e:
    raise UnsupportedArchitecture(
        f"{directory}/config.json maps to an invalid model: {e}"
    ) from None

  expected = _expected_shapes(c)
  flat: dict[tuple[str, ...], np.ndarray] = {}
  np_dtype = dtype_of(dtype)
  for rule in _rules(c, architecture, ""):
    missing = [n for n in rule.hf if n not in tensors]
    if missing:
      raise MissingTensor(
          f"{directory}: tensor {_full_name(missing[0], architecture)} is "
          f"missing, but {architecture} with this config.json needs it: the weights are "
          "incomplete or belong to another architecture"
      )
    shapes = [expected[p] for p in rule.ours]
    for name, want in zip(rule.hf, _hf_shapes(rule, shapes)):
      got = tuple(tensors[name].shape)
      if got != tuple(want):
        raise TensorShapeMismatch(
            f"{directory}: tensor {_full_name(name, architecture)} has shape {got}, but "
            f"config.json ({_summary(hf, family)}) implies {tuple(want)}: the weights and "
            "config.json come from different models; use the config.json saved with them"
        )
    arrays = _to_ours(rule, [tensors.pop(n) for n in rule.hf], shapes)
    for path, array in zip(rule.ours, arrays):
      flat[path] = np.ascontiguousarray(array.astype(np_dtype))
  ignorable = _ignorable(c)
  left = sorted(_full_name(n, architecture) for n in tensors if not ignorable.fullmatch(n))
  if left:
    more = f" and {len(left) - 3} more" if len(left) > 3 else ""
    raise UnexpectedTensor(
        f"{directory}: tensors {', '.join(left[:3])}{more} are not used by {architecture} with "
        f"this config.json ({_summary(hf, family)}): the config and the weights disagree"
    )
  assert set(flat) == set(expected), sorted(set(flat) ^ set(expected))
  return fields, _nest(flat)


def _full_name(name: str, architecture: str) -> str:
  """A tensor name as `architecture` stores it (head tensors carry no base prefix)."""
  if name.startswith(("lm_head.", "cls.", "classifier.")):
    return name
  return BASE_PREFIX.get(architecture, "") + name


def save_hf(
    directory,
    model,
    params,
    architecture: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> str:
  """Write `params` of `model` (ModelConfig, fields dict or ConfigDict) as a Hugging Face model.

  Writes config.json and model.safetensors into `directory` (created if needed), which
  transformers' `<architecture>.from_pretrained(directory)` loads. `architecture` defaults to the
  one matching the family and head (GPT2LMHeadModel, BertModel, BertForMaskedLM, ViTModel,
  ViTForImageClassification). `params` may be boxed, scanned (`layers`) or looped, jax or numpy.
  `extra_config` entries (token ids, id2label, ...) are merged into config.json. Returns the
  architecture written.
  """
  from flax import linen as nn
  from safetensors.numpy import save_file

  from transformers_jax.models import as_model_config
  from transformers_jax.modules.block import scan_to_loop

  c = as_model_config(model)
  architecture = architecture or _default_architecture(c)
  if architecture not in SUPPORTED_ARCHITECTURES:
    raise UnsupportedConfig(
        f"cannot write a {c.family} model with head {c.head_kind!r} as {architecture or 'any'} "
        f"Hugging Face architecture: supported are {', '.join(SUPPORTED_ARCHITECTURES)}"
    )
  _check_exportable(c, architecture)
  params = params.get("params", params) if "params" in params and len(params) == 1 else params
  flat = {p: np.asarray(v) for p, v in _flat_arrays(scan_to_loop(nn.unbox(params))).items()}
  if c.padded_vocab != c.vocab_size:  # Hugging Face holds the V real rows only
    flat = _unpad_vocab(flat, c)
    c = c.replace(vocab_multiple=1)
  expected = _expected_shapes(c)
  missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
  if missing:
    raise UnsupportedConfig(
        f"params have no {'/'.join(missing[0])}, which the config implies: "
        "pass the parameters made with this config"
    )
  if extra:
    raise UnsupportedConfig(
        f"params hold {'/'.join(extra[0])}, which the config does not imply: "
        "pass the config these parameters were made with"
    )
  for path, want in expected.items():
    if flat[path].shape != want:
      raise TensorShapeMismatch(
          f"params {'/'.join(path)} has shape {flat[path].shape}, the "
          f"config implies {want}: pass the matching config"
      )

  tensors: dict[str, np.ndarray] = {}
  for rule in _rules(c, architecture, BASE_PREFIX.get(architecture, "")):
    for name, array in zip(rule.hf, _to_hf(rule, [flat[p] for p in rule.ours])):
      tensors[name] = np.ascontiguousarray(array)
  if "cls.predictions.bias" in tensors and not c.tie_embeddings:  # what an untied decoder uses
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"].copy()
  dtypes = {str(a.dtype) for a in tensors.values()}
  hf = _hf_from_config(c, architecture, dtypes.pop() if len(dtypes) == 1 else "float32")
  hf.update(extra_config or {})
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
  save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})
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


def _flat_arrays(tree, prefix=()) -> dict[tuple[str, ...], Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(_flat_arrays(value, prefix + (str(key),)))
    else:
      out[prefix + (str(key),)] = value
  return out
