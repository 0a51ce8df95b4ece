"""The model configuration: one validated dataclass shared by every family.

Config files under experiments/ build an `ml_collections.ConfigDict` whose `model` field holds
these names; `ModelConfig.from_dict(config.model)` validates it before anything is traced. Every
field has a default and a line saying what it does; `None` means "derived" (see `resolved`)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any
from collections.abc import Mapping

import ml_collections

from transformers_jax.modules import feed_forward, lora, remat, scores
from transformers_jax.modules.common import ACTIVATIONS
from transformers_jax.modules.placement_base import config_problem
from transformers_jax.modules.placements import PLACEMENTS
from transformers_jax.modules.positions import POSITION_SCHEMES, position_scheme

FAMILIES = ("decoder", "encoder", "encoder_decoder", "vit")
POSITIONS = tuple(POSITION_SCHEMES)  # modules/positions.py: what each one does
NORMS = ("layernorm", "rmsnorm", "scalenorm", "dyt")
FEED_FORWARDS = ("dense", "moe")
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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one model. Field comments are the documentation."""

  family: str = "decoder"  # decoder | encoder | encoder_decoder | vit
  num_layers: int = 2  # blocks per stack (both stacks of an encoder_decoder unless set below)
  num_encoder_layers: int | None = None  # encoder_decoder only; None = num_layers
  num_decoder_layers: int | None = None  # encoder_decoder only; None = num_layers
  d_model: int = 64  # width of the residual stream (D)
  num_heads: int = 4  # query heads (H)
  num_kv_heads: int | None = None  # key/value heads (G); None = num_heads (MHA); 1 = MQA
  head_dim: int | None = None  # per-head width (K); None = d_model // num_heads
  d_ff: int | None = None  # feed-forward hidden width (F); None = 4 * d_model
  vocab_size: int = 256  # token vocabulary (V); unused by vit
  # Embedding rows and logits are padded to a multiple of this, so that the vocabulary splits
  # evenly over tensor-parallel devices (Megatron and nanoGPT pad GPT-2's 50,257 to 50,304 with
  # 128). Padded ids never occur: their logits are masked out, and parameter counts, Hugging
  # Face conversion and decoding see V rows only.
  vocab_multiple: int = 1
  max_len: int = 128  # longest sequence (learned-position table size; RoPE/sinusoid range)
  position_offset: int = 0  # learned: table rows before position 0, never looked up (BART: 2)
  type_vocab_size: int = 0  # token-type (segment) embeddings, BERT uses 2; 0 = none
  positions: str = "learned"  # learned | sinusoidal(_halves) | rope | t5 | alibi | none
  rope_theta: float = 10000.0  # RoPE base wavelength
  # RoPE frequency scaling: "" | llama3:FACTOR,LOW,HIGH,ORIGINAL_LENGTH (Llama 3.1: 8,1,4,8192)
  rope_scaling: str = ""
  relative_buckets: int = 32  # t5: buckets of the key - query offset (one learned bias each)
  relative_max_distance: int = 128  # t5: offsets from here on share the last bucket
  # Norms, residual gains and init rules around each sublayer: pre | post | sandwich | none |
  # deepnorm | admin | rezero | layerscale | tfixup | reordered | normformer | hybrid | subln |
  # b2t | scaled | parallel | mixln (formulas: docs/norm_zoo.md; code: modules/placements.py)
  norm_placement: str = "pre"
  # The placement's constant (mixln: post-LN fraction alpha; layerscale: lambda's initial
  # value); None = the paper's value. Placements without one refuse a value.
  norm_placement_arg: float | None = None
  norm: str = "layernorm"  # layernorm | rmsnorm | scalenorm | dyt (see modules/norms.py)
  norm_eps: float = 1e-5  # epsilon inside the norm's square root
  qk_norm: bool = False  # `norm` (layernorm | rmsnorm) on each head's queries and keys
  norm_scale: bool = True  # learned scale (gamma) in every norm
  norm_unit_offset: bool = False  # the scale is stored as w and applied as 1 + w (Gemma)
  norm_bias: bool | None = None  # learned shift (beta); None = on for layernorm and dyt only
  final_norm: bool | None = None  # norm after the last block; None = the placement's default
  embed_norm: bool = False  # norm right after the embeddings (BERT)
  embed_scale: bool = False  # multiply token embeddings by sqrt(d_model) (2017 Transformer)
  # relu | gelu (exact) | gelu_tanh | silu | swiglu | geglu | geglu_tanh (modules/common.py)
  activation: str = "gelu"
  use_bias: bool = True  # biases in attention and feed-forward projections
  qkv_bias: bool | None = None  # biases on query/key/value only (Qwen2); None = use_bias
  scale_scores: bool = True  # attention scores q.k / sqrt(head_dim); False = q.k (T5)
  score_scale_width: int = 0  # scores q.k / sqrt(this), not sqrt(head_dim) (Gemma 2 27B: 144)
  unembed_scale: bool = False  # hidden states times d_model^-1/2 before the unembedding (T5)
  residual: bool = True  # residual connections around each sublayer
  dropout: float = 0.0  # dropout on residual branches and embeddings
  attention_dropout: float = 0.0  # dropout on attention weights
  # auto | fused (jax.nn.dot_product_attention) | cudnn | einsum | flash (blockwise, plain JAX)
  # | splash (TPU Pallas); auto = splash on TPU, cuDNN on GPU, flash on CPU from 2,048 tokens
  attention_impl: str = "auto"
  attention_query_blocks: int = 4  # einsum, causal: query blocks that skip their masked keys
  attention_block_q: int = 512  # flash / splash: queries per block (splash: a multiple of 128)
  attention_block_kv: int = 512  # flash / splash: keys per block (splash: a multiple of 128)
  # mesh.context > 1: all_gather (every device gathers all keys/values) | ring (blocks passed on)
  context_strategy: str = "all_gather"
  # causal self-attention sees only keys fewer than this many positions back (0 = all of them;
  # Mistral 7B v0.1: 4,096)
  sliding_window: int = 0
  sliding_every: int = 1  # with sliding_window: only blocks 0, n, 2n, … slide (Gemma 2: 2)
  attention_softcap: float = 0.0  # attention scores s -> cap tanh(s / cap) (Gemma 2: 50); 0 = off
  logit_softcap: float = 0.0  # output logits z -> cap tanh(z / cap) (Gemma 2: 30); 0 = off
  feed_forward: str = "dense"  # dense | moe
  num_experts: int = 8  # moe: experts per layer (E)
  top_k: int = 2  # moe: experts each token is routed to
  capacity_factor: float = 1.25  # moe: expert capacity = ceil(cf * tokens * top_k / E)
  moe_every: int = 1  # moe: every n-th block uses MoE (1 = all); others stay dense
  # moe: dense ([B, T, E, C] one-hot einsums with a capacity, the reference) | ragged (tokens
  # sorted by expert, grouped matmuls; with mesh.expert > 1 tokens travel to their experts)
  moe_impl: str = "dense"
  moe_dropless: bool = True  # ragged: compute every routing choice; False = capacity_factor drops
  tie_embeddings: bool = True  # unembedding (or MLM decoder) reuses the token embedding
  share_embeddings: bool = True  # encoder_decoder: source and target share one embedding
  # encoder_decoder with share_embeddings: one token table, but each stack has its own learned
  # positions and embed_norm (BART)
  stack_embeddings: bool = False
  head: str = ""  # output head (HEADS[family]); "" = the family's: lm | pooler | classifier
  num_classes: int = 0  # classifier heads (encoder classifier, vit)
  image_size: int = 224  # vit: square image side in pixels
  patch_size: int = 16  # vit: square patch side in pixels
  num_channels: int = 3  # vit: image channels
  pool: str = "cls"  # vit: cls token or mean of patch tokens
  init_std: float = 0.02  # stddev of the normal initialiser for weights and embeddings
  scan_layers: bool = False  # nn.scan over the blocks: one compiled body for any depth
  # none | full | minimal | save_dot_except_mlpwi | save_qkv_proj | ... | custom (modules/remat.py)
  remat: str = "none"
  remat_save: str = ""  # remat=custom: name:device|offload|remat,... e.g. qkv_proj:offload
  dtype: str = "float32"  # compute dtype (bfloat16 on accelerators)
  param_dtype: str = "float32"  # parameter storage dtype
  # LoRA: a trained rank-r update (lora_alpha / r) * A B beside each projection lora_targets
  # names, all else frozen (no optimizer state); 0 = off (docs/lora.md)
  lora_rank: int = 0
  lora_alpha: float = 16.0  # the adapters' scale is lora_alpha / lora_rank
  lora_dropout: float = 0.0  # dropout on the adapters' input while training
  lora_targets: str = "q,v"  # comma-separated: q, k, v, out (attention), mlp_in, mlp_out

  # ------------------------------------------------------------------ derived values
  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def padded_vocab(self) -> int:
    """Rows of the embedding table and width of the logits: V rounded up to vocab_multiple."""
    return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

  @property
  def head_width(self) -> int:
    return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

  @property
  def ff_width(self) -> int:
    return 4 * self.d_model if self.d_ff is None else self.d_ff

  @property
  def encoder_layers(self) -> int:
    return self.num_layers if self.num_encoder_layers is None else self.num_encoder_layers

  @property
  def decoder_layers(self) -> int:
    return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

  @property
  def has_norm_bias(self) -> bool:
    return (self.norm in ("layernorm", "dyt")) if self.norm_bias is None else self.norm_bias

  @property
  def has_final_norm(self) -> bool:
    placement = PLACEMENTS[self.norm_placement].final_norm
    return placement if self.final_norm is None else self.final_norm

  @property
  def head_kind(self) -> str:
    return self.head or HEADS[self.family][0]

  @property
  def gated(self) -> bool:
    return ACTIVATIONS[self.activation][2]

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def seq_len_max(self) -> int:
    """Longest token sequence the position table must cover."""
    vit = self.family == "vit"
    return self.num_patches + (1 if self.pool == "cls" else 0) if vit else self.max_len

  def is_moe_layer(self, index: int) -> bool:
    return self.feed_forward == "moe" and (index + 1) % self.moe_every == 0

  # ------------------------------------------------------------------ construction
  @classmethod
  def from_dict(cls, d: Mapping[str, Any] | ml_collections.ConfigDict) -> "ModelConfig":
    if isinstance(d, ml_collections.ConfigDict):
      d = d.to_dict()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(
          f"model.{unknown[0]}: unknown field; valid fields are {', '.join(sorted(names))}"
      )
    return cls(**dict(d))

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def unrolled(self) -> "ModelConfig":
    """The blocks unrolled, no remat (counting shapes, naming tensors): remat_save reset too."""
    return self.replace(scan_layers=False, remat="none", remat_save="")

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def __post_init__(self):
    validate(self)


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


def _check_types(c: ModelConfig) -> None:
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


def validate(c: ModelConfig) -> None:
  """Raise ValueError naming the field and the fix; called on construction, before tracing."""
  _check_types(c)
  _choice(c, "family", FAMILIES)
  _choice(c, "positions", POSITIONS)
  _choice(c, "norm_placement", tuple(PLACEMENTS))
  _choice(c, "norm", NORMS)
  _choice(c, "activation", tuple(ACTIVATIONS))
  _choice(c, "feed_forward", FEED_FORWARDS)
  _choice(c, "moe_impl", MOE_IMPLS)
  _choice(c, "attention_impl", ATTENTION_IMPLS)
  _choice(c, "context_strategy", ("all_gather", "ring"))
  _choice(c, "dtype", DTYPES)
  _choice(c, "param_dtype", DTYPES)
  _choice(c, "pool", POOLS)
  if c.head and c.head not in HEADS[c.family]:
    _fail("head", repr(c.head), f"the {c.family} family has heads {', '.join(HEADS[c.family])}")
  positive = "num_layers d_model num_heads max_len attention_query_blocks vocab_multiple"
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
  for field in ("num_encoder_layers", "num_decoder_layers", "num_kv_heads", "head_dim", "d_ff"):
    value = getattr(c, field)
    if value is not None and value < 1:
      _fail(field, str(value), "must be a positive integer or None (derived)")
  if c.head_dim is None and c.d_model % c.num_heads:
    _fail(
        "num_heads",
        str(c.num_heads),
        f"must divide d_model={c.d_model} (or set model.head_dim explicitly)",
    )
  if c.num_heads % c.kv_heads:
    _fail("num_kv_heads", str(c.kv_heads), f"must divide num_heads={c.num_heads}")
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
  if c.family == "vit":
    if c.patch_size < 1 or c.image_size < 1:
      _fail("patch_size", str(c.patch_size), "image_size and patch_size must be positive")
    if c.image_size % c.patch_size:
      _fail("image_size", str(c.image_size), f"must be divisible by patch_size={c.patch_size}")
    if c.num_channels < 1:
      _fail("num_channels", str(c.num_channels), "must be a positive integer")
  checks = (
      lambda c: config_problem(c, PLACEMENTS[c.norm_placement]),  # placement_base.py
      lora.config_problem,
      remat.config_problem,
      position_scheme(c).config_problem,
      feed_forward.config_problem,
      scores.config_problem,
  )
  for problem in (check(c) for check in checks):
    if problem:
      _fail(*problem)
  if c.stack_embeddings and not (c.family == "encoder_decoder" and c.share_embeddings):
    _fail("stack_embeddings", "True", "only an encoder_decoder with share_embeddings=True")
  if c.scan_layers and c.feed_forward == "moe" and c.moe_every != 1:
    _fail(
        "moe_every",
        str(c.moe_every),
        "scan_layers needs identical blocks: use moe_every=1 or scan_layers=False",
    )


def model_config_dict(**overrides) -> ml_collections.ConfigDict:
  """A ConfigDict holding every ModelConfig field at its default, then `overrides`.

  Fields whose default is None are given a placeholder type so that command-line overrides such
  as `--config.model.num_kv_heads=2` type-check.
  """
  base = ModelConfig().to_dict()
  # "int | None" -> int: the type a derived (None) field takes when set
  kinds = {
      f.name: {"int": int, "bool": bool, "float": float, "str": str}[str(f.type).split(" |")[0]]
      for f in dataclasses.fields(ModelConfig)
  }
  d = ml_collections.ConfigDict()
  for name, value in base.items():
    if value is None:
      setattr(d, name, ml_collections.config_dict.placeholder(kinds[name]))
    else:
      setattr(d, name, value)
  for name, value in overrides.items():
    if name not in base:
      raise ValueError(f"model.{name}: unknown field")
    setattr(d, name, value)
  return d


def load_config_module(path: str):
  """Import an experiments/*.py config file by path (as absl's config_flags does)."""
  import importlib.util
  import pathlib

  p = pathlib.Path(path)
  if not p.is_file():
    raise FileNotFoundError(f"config file {path} does not exist")
  spec = importlib.util.spec_from_file_location(p.stem, p)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
