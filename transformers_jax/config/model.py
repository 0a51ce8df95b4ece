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
from transformers_jax.modules.activations import ACTIVATIONS
from transformers_jax.modules.norms import NORM_KINDS
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
  # encoder_decoder: the decoder stack's query heads (BART and Marian may differ); None = num_heads
  decoder_num_heads: int | None = None
  num_kv_heads: int | None = None  # key/value heads (G); None = num_heads (MHA); 1 = MQA
  head_dim: int | None = None  # per-head width (K); None = d_model // num_heads
  d_ff: int | None = None  # feed-forward hidden width (F); None = 4 * d_model
  decoder_d_ff: int | None = None  # encoder_decoder: the decoder stack's F; None = d_ff
  vocab_size: int = 256  # token vocabulary (V); unused by vit
  # Embedding rows and logits are padded to a multiple of this, so that the vocabulary splits
  # evenly over tensor-parallel devices (Megatron and nanoGPT pad GPT-2's 50,257 to 50,304 with
  # 128). Padded ids never occur: their logits are masked out, and parameter counts, Hugging
  # Face conversion and decoding see V rows only.
  vocab_multiple: int = 1
  max_len: int = 128  # longest sequence (learned-position table size; RoPE/sinusoid range)
  position_offset: int = 0  # learned: table rows before position 0, never looked up (BART: 2)
  type_vocab_size: int = 0  # token-type (segment) embeddings, BERT uses 2; 0 = none
  positions: str = "learned"  # the position scheme (modules/positions/ says what each does)
  rope_theta: float = 10000.0  # RoPE base wavelength
  # RoPE frequency scaling: "" | llama3:FACTOR,LOW,HIGH,ORIGINAL_LENGTH (Llama 3.1: 8,1,4,8192)
  # | yarn:FACTOR,BETA_FAST,BETA_SLOW,ORIGINAL_LENGTH[,TRUNCATE[,ATTENTION_FACTOR[,MSCALE_ALL_DIM]]]
  # (gpt-oss: yarn:32,32,1,4096,0; DeepSeek-V3: yarn:40,32,1,4096,1,1,1; modules/yarn.py)
  rope_scaling: str = ""
  relative_buckets: int = 32  # t5: buckets of the key - query offset (one learned bias each)
  relative_max_distance: int = 128  # t5: offsets from here on share the last bucket
  # Norms, residual gains and init rules around each sublayer (formulas: docs/norm_zoo.md; code:
  # modules/placements/)
  norm_placement: str = "pre"
  # The placement's constant (mixln: post-LN fraction alpha; layerscale: lambda's initial
  # value); None = the paper's value. Placements without one refuse a value.
  norm_placement_arg: float | None = None
  # hyper, mhc: copies of the residual stream each block reads and writes, the expansion rate n
  # (Zhu et al. 2024 and Xie et al. 2025: 4)
  residual_streams: int = 4
  # hyper: connection matrices plus input-dependent terms (dynamic hyper-connections); False =
  # static ones only
  hyper_dynamic: bool = False
  # every self-attention after a stack's first mixes its values with the first block's,
  # V_n <- l1 V_n + l2 V_1, l1 and l2 learned per block from 0.5 (ResFormer, Zhou et al. 2024)
  value_residual: bool = False
  norm: str = "layernorm"  # the norm every placement uses (modules/norm_kinds.py)
  dyt_alpha: float = 0.5  # dyt: alpha's initial value (Zhu et al. 2025: 0.5)
  # dyt: alpha's initial value in the norms before attention; None = dyt_alpha (the DyT paper's
  # LLM recipe sets the two apart by width, e.g. 0.8 and 0.2 for LLaMA 7B)
  dyt_alpha_attention: float | None = None
  norm_eps: float = 1e-5  # epsilon inside the norm's square root
  qk_norm: bool = False  # `norm` (layernorm | rmsnorm) on the queries and keys
  # qk_norm's extent: head (each head's over head_dim, one gain vector shared by the heads: Qwen3,
  # Gemma 3) | full (the whole projection, H*K and G*K wide: OLMo 2) | l2 (each head's over
  # head_dim, RMS without gains: Llama 4)
  qk_norm_kind: str = "head"
  # qk_norm on the blocks RoPE rotates only, the NoPE blocks' queries and keys left as they are
  # (Llama 4; with qk_norm_kind=l2, which has no parameters to differ between blocks)
  qk_norm_rope_only: bool = False
  norm_scale: bool = True  # learned scale (gamma) in every norm
  norm_unit_offset: bool = False  # the scale is stored as w and applied as 1 + w (Gemma)
  # learned shift (beta); None = the norm kind's default (the + beta of its formula)
  norm_bias: bool | None = None
  final_norm: bool | None = None  # norm after the last block; None = the placement's default
  embed_norm: bool = False  # norm right after the embeddings (BERT)
  embed_scale: bool = False  # multiply token embeddings by sqrt(d_model) (2017 Transformer)
  # a learned scalar times the token embeddings, initialised to sqrt(d_model) (DyT's LLM recipe)
  embed_scale_learned: bool = False
  # the feed-forward non-linearity; the *glu ones are gated (modules/activations.py)
  activation: str = "gelu"
  glu_alpha: float = 1.702  # swiglu_clamped: the gate's sigmoid gain, g sigmoid(alpha g) (gpt-oss)
  glu_limit: float = 7.0  # swiglu_clamped: gate clamped above at +limit, up to [-limit, limit]
  use_bias: bool = True  # biases in attention and feed-forward projections
  ffn_bias: bool | None = (
      None  # biases in the feed-forward only (Llama's mlp_bias); None = use_bias
  )
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
  # each block's attention and rotation: a comma-separated period of modules/layer_types.py's
  # entries repeated over the blocks, e.g. sliding,sliding,sliding,sliding,sliding,full (Gemma 3)
  # or full,full,full,nope (SmolLM3); "" = sliding_window / sliding_every decide
  layer_types: str = ""
  # RoPE base of the sliding layers, which then take no rope_scaling (Gemma 3: 10,000 beside
  # the global layers' 1,000,000); 0 = as the other layers
  rope_local_theta: float = 0.0
  attention_chunk: int = 0  # chunked layers: a query sees its own chunk of this many positions
  # NoPE layers' attention temperature (Llama 4's attn_temperature_tuning): queries at position p
  # times 1 + attention_temperature_scale * log(1 + floor((p + 1) / this)); 0 = off (Llama 4: 8192)
  attention_temperature_floor: int = 0
  attention_temperature_scale: float = 0.1  # the temperature's strength (Llama 4's attn_scale)
  attention_softcap: float = 0.0  # attention scores s -> cap tanh(s / cap) (Gemma 2: 50); 0 = off
  # a learned logit per query head in every softmax's denominator, as a key with value zero that
  # every query sees: a head may attend nowhere (gpt-oss's attention sinks; modules/sinks.py)
  attention_sinks: bool = False
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
  router_bias: bool = False  # moe: a learned bias on the router's logits (gpt-oss)
  # moe: the top_k chosen probabilities renormalised to sum to 1 (Mixtral, gpt-oss; Qwen3-MoE's
  # norm_topk_prob); False = the softmax's own, over all experts (Qwen1.5-MoE, OLMoE)
  router_norm_topk: bool = True
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
  # moe: each chosen expert's weight multiplies the token on its way in, f(w x), rather than the
  # expert's output, w f(x) (Llama 4)
  moe_scale_input: bool = False
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
  # how init scales, multipliers and per-tensor Adam rates follow width and depth
  # (modules/parametrization.py, docs/mup.md): sp (standard) | mup (Yang et al. 2021) |
  # complete_p (Dey et al. 2025: mup plus depth); the last two scale from a base shape
  parametrization: str = "sp"
  mup_base_width: int = 0  # mup, complete_p: the d_model the learning rate was tuned at
  mup_base_depth: int = 0  # complete_p: the blocks per stack the learning rate was tuned at
  scan_layers: bool = False  # nn.scan over the blocks: one compiled body for any depth
  # mesh.stage > 1: the pipeline's microbatches (0 = one per stage; modules/pipeline.py), set
  # by training from --config.pipeline.microbatches
  pipeline_microbatches: int = 0
  # the pipeline's passes over the stages (1 = GPipe), set by training from --config.pipeline.repeats
  pipeline_repeats: int = 1
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
  # the Block's matmuls through qwix, per channel, straight-through gradients: '' (float) | int8
  # | fp8 (e4m3 forward, e5m2 gradients) | int8_weights (weights only); docs/quantization.md
  quantization: str = ""
  quantization_head: bool = False  # the output head's matmul quantized too (else float)
  kv_cache_dtype: str = ""  # decoding: '' = the compute dtype | int8 (per-token, per-head scales)
  # LoRA: modules trained in full beside the adapters (PEFT's modules_to_save), comma-separated:
  # embed, head, or a block projection as lora_targets names them; "" = the adapters alone
  lora_modules_to_save: str = ""

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
  def has_ffn_bias(self) -> bool:
    return self.use_bias if self.ffn_bias is None else self.ffn_bias

  def stack_config(self, role: str) -> "ModelConfig":
    """The config a stack's blocks read: an encoder_decoder's decoder with its own heads and
    feed-forward width (decoder_num_heads, decoder_d_ff), every other stack this config."""
    if role != "decoder" or (self.decoder_num_heads is None and self.decoder_d_ff is None):
      return self
    return self.replace(
        num_heads=self.decoder_num_heads or self.num_heads,
        d_ff=self.decoder_d_ff or self.d_ff,
        decoder_num_heads=None,
        decoder_d_ff=None,
    )

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
    return NORM_KINDS[self.norm].bias_by_default if self.norm_bias is None else self.norm_bias

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
    return ACTIVATIONS[self.activation].gated

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
