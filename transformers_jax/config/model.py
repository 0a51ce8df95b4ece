"""The model configuration: one validated dataclass shared by every family.

Config files under experiments/ build an `ml_collections.ConfigDict` whose `model` field holds
these names; `ModelConfig.from_dict(config.model)` validates it before anything is traced. Every
field has a default and a line saying what it does; `None` means "derived" (see `resolved`)."""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Mapping

import ml_collections

from transformers_jax.config.checks import HEADS, validate
from transformers_jax.modules.common import ACTIVATIONS
from transformers_jax.modules.placements import PLACEMENTS


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one model. Field comments are the documentation."""

  family: str = "decoder"  # the model family: how embeddings, blocks and head are wired
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
  positions: str = "learned"  # the position scheme (modules/positions.py says what each does)
  rope_theta: float = 10000.0  # RoPE base wavelength
  # RoPE frequency scaling: "" | llama3:FACTOR,LOW,HIGH,ORIGINAL_LENGTH (Llama 3.1: 8,1,4,8192)
  # | yarn:FACTOR,ORIGINAL_LENGTH,BETA_FAST,BETA_SLOW,MSCALE,MSCALE_ALL_DIM (DeepSeek-V3:
  # 40,4096,32,1,1,1; modules/yarn.py)
  rope_scaling: str = ""
  relative_buckets: int = 32  # t5: buckets of the key - query offset (one learned bias each)
  relative_max_distance: int = 128  # t5: offsets from here on share the last bucket
  # Norms, residual gains and init rules around each sublayer (formulas: docs/norm_zoo.md; code:
  # modules/placements/)
  norm_placement: str = "pre"
  # The placement's constant (mixln: post-LN fraction alpha; layerscale: lambda's initial
  # value); None = the paper's value. Placements without one refuse a value.
  norm_placement_arg: float | None = None
  norm: str = "layernorm"  # the norm every placement uses (modules/norms.py)
  dyt_alpha: float = 0.5  # dyt: alpha's initial value (Zhu et al. 2025: 0.5)
  # dyt: alpha's initial value in the norms before attention; None = dyt_alpha (the DyT paper's
  # LLM recipe sets the two apart by width, e.g. 0.8 and 0.2 for LLaMA 7B)
  dyt_alpha_attention: float | None = None
  norm_eps: float = 1e-5  # epsilon inside the norm's square root
  qk_norm: bool = False  # `norm` (layernorm | rmsnorm) on each head's queries and keys
  norm_scale: bool = True  # learned scale (gamma) in every norm
  norm_unit_offset: bool = False  # the scale is stored as w and applied as 1 + w (Gemma)
  norm_bias: bool | None = None  # learned shift (beta); None = on for layernorm and dyt only
  final_norm: bool | None = None  # norm after the last block; None = the placement's default
  embed_norm: bool = False  # norm right after the embeddings (BERT)
  embed_scale: bool = False  # multiply token embeddings by sqrt(d_model) (2017 Transformer)
  # a learned scalar times the token embeddings, initialised to sqrt(d_model) (DyT's LLM recipe)
  embed_scale_learned: bool = False
  # the feed-forward non-linearity; the *glu ones are gated (modules/common.py)
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
  feed_forward: str = "dense"  # a dense feed-forward network, or a mixture of experts
  num_experts: int = 8  # moe: experts per layer (E)
  top_k: int = 2  # moe: experts each token is routed to
  capacity_factor: float = 1.25  # moe: expert capacity = ceil(cf * tokens * top_k / E)
  moe_every: int = 1  # moe: every n-th block uses MoE (1 = all); others stay dense
  # moe: dense ([B, T, E, C] one-hot einsums with a capacity, the reference) | ragged (tokens
  # sorted by expert, grouped matmuls; with mesh.expert > 1 tokens travel to their experts)
  moe_impl: str = "dense"
  moe_dropless: bool = True  # ragged: compute every routing choice; False = capacity_factor drops
  # DeepSeek's mixture of experts (modules/moe_routing.py)
  num_shared_experts: int = 0  # moe: experts of width d_ff every token passes through besides
  moe_first_dense: int = 0  # moe: the first n blocks stay dense (DeepSeek-V3: 3)
  moe_dense_d_ff: int | None = None  # moe: the dense blocks' hidden width; None = d_ff
  moe_score: str = "softmax"  # moe: router scores, softmax over experts | sigmoid per expert
  # moe: DeepSeek-V3's auxiliary-loss-free balancing: a bias per expert added to the scores for
  # choosing only, moved by moe_bias_speed after each step against the expert's load (kept in
  # the parameters, never trained)
  moe_score_bias: bool = False
  moe_bias_speed: float = 0.001  # moe_score_bias: the bias update speed gamma; 0 = frozen
  moe_groups: int = 1  # moe: experts in this many groups; tokens choose within moe_top_groups
  moe_top_groups: int = 1  # moe: groups each token's experts come from (DeepSeek-V3: 4 of 8)
  moe_routed_scale: float = 1.0  # moe: routed experts' weights times this (DeepSeek-V3: 2.5)
  moe_norm_top_k: bool = True  # moe: the top_k chosen weights renormalised to sum to 1
  # Multi-head latent attention (DeepSeek-V2/V3; modules/mla.py): keys and values expanded from
  # one compressed latent of this width per token, all decoding caches; 0 = plain attention
  kv_lora_rank: int = 0
  q_lora_rank: int = 0  # mla: queries through a latent of this width too; 0 = projected directly
  qk_nope_head_dim: int = 0  # mla: per-head query/key width without positions
  qk_rope_head_dim: int = 0  # mla: per-head width RoPE rotates, its key shared by every head
  v_head_dim: int = 0  # mla: per-head value width
  # decoder: multi-token prediction modules (DeepSeek-V3: 1), each predicting one token further
  # with its own block and the model's embedding and head; task=mtp trains them (models/mtp.py)
  mtp_depth: int = 0
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
  init: str = "gpt2"  # the initialisation (modules/inits.py; paper: the placement's own)
  scan_layers: bool = False  # nn.scan over the blocks: one compiled body for any depth
  # what the backward pass keeps and what it recomputes (modules/remat.py)
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
  def mla(self) -> bool:
    """Self-attention is multi-head latent attention (modules/mla.py)."""
    return self.kv_lora_rank > 0

  @property
  def dense_ff_width(self) -> int:
    """The hidden width of the dense feed-forward blocks (those of an MoE model: their own)."""
    moe = self.feed_forward == "moe" and self.moe_dense_d_ff is not None
    return self.moe_dense_d_ff if moe else self.ff_width

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
  def has_embed_norm(self) -> bool:
    """A norm after the embeddings: model.embed_norm, or the placement's own (Peri-LN)."""
    return self.embed_norm or PLACEMENTS[self.norm_placement].embed_norm

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
    first = index >= self.moe_first_dense
    return self.feed_forward == "moe" and first and (index + 1) % self.moe_every == 0

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
