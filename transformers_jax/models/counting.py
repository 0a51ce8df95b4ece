"""Parameter accounting: eval_shape counts, the analytic formula, per-component shares.

The analytic formula generalises the classic GPT-2 count
    V*d + ctx*d + L * (12 d^2 + 13 d) + 2 d
to every option of ModelConfig (GQA, separate head_dim, gated FFNs, MoE, biases, norm kinds and
placements, every family and head). Tests hold it equal to the eval_shape count, component by
component.

FLOPs per token and param_count's summary of both: models/flops.py.
"""

from __future__ import annotations

import collections
import functools
import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.config import ModelConfig
from transformers_jax.models import as_model_config, param_shapes
from transformers_jax.models import lora as lora_params
from transformers_jax.models.common import has_logit_gain
from transformers_jax.modules.block import Block
from transformers_jax.modules.common import dtype_of
from transformers_jax.modules import lora, moe_routing
from transformers_jax.modules.feed_forward import FEED_FORWARDS
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.positions import position_scheme

COMPONENTS = (
    "token_embedding",
    "position_embedding",
    "type_embedding",
    "patch_embedding",
    "attention",
    "feed_forward",
    "norms",
    "gains",
    "position_bias",
    "head",
    "lora",
    "mtp",
)


def ordered(parts: dict) -> dict:
  """`parts` with the COMPONENTS first, in their order, then any other component."""
  return {**{k: parts[k] for k in COMPONENTS if k in parts}, **parts}


HEAD_MODULES = (
    "lm_head",
    "pooler",
    "classifier",
    "mlm_transform",
    "mlm_norm",
    "mlm_bias",
    "mlm_decoder",
)
STACKS = ("decoder", "encoder")


def component_of(path: tuple[str, ...]) -> str:
  """Which component a parameter (given its path of module names) belongs to."""
  if path[-1] in ("lora_a", "lora_b"):  # LoRA adapters (models/lora.py)
    return "lora"
  if path[0] == "mtp":  # multi-token prediction's modules (models/mtp.py)
    return "mtp"
  if path[0] in HEAD_MODULES:
    return "head"
  if path[-1].endswith("_bias"):  # a position scheme's score-bias weights (positions/base.py)
    return "position_bias"
  if any(p.endswith("_gain") for p in path):  # a norm placement's learned gains
    return "gains"
  if any("norm" in p for p in path):
    return "norms"
  if any("attn" in p for p in path):
    return "attention"
  if "ffn" in path:
    return "feed_forward"
  for name, component in (
      ("token_embed", "token_embedding"),
      ("pos_embed", "position_embedding"),
      ("type_embed", "type_embedding"),
      ("patch_embed", "patch_embedding"),
      ("cls_token", "patch_embedding"),
  ):
    if name in path:
      return component
  raise ValueError(f"parameter {'/'.join(path)} belongs to no known component")


def _paths(tree):
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    yield tuple(jax.tree_util.keystr(keypath, simple=True, separator="/").split("/")), leaf


def vocab_padding(cfg) -> dict[str, int]:
  """Parameters in the rows that pad the vocabulary to `vocab_multiple` (no token uses them),
  per component: what counts leave out."""
  c = as_model_config(cfg)
  extra = c.padded_vocab - c.vocab_size
  if not extra or c.family == "vit":
    return {}
  embedders = 2 if (c.family == "encoder_decoder" and not c.share_embeddings) else 1
  head = (0 if c.tie_embeddings else extra * c.d_model) + (extra if c.head_kind == "mlm" else 0)
  out = {"token_embedding": embedders * extra * c.d_model}
  if head and c.head_kind in ("lm", "mlm"):
    out["head"] = head
  if has_logit_gain(c) and c.head_kind in ("lm", "mlm"):  # nGPT's s_z, one per vocabulary row
    out["gains"] = extra
  return out


def tree_breakdown(tree, cfg=None) -> dict[str, int]:
  """Parameter counts per component of a (shape) tree; also `blocks`, everything in the stacks.
  With the tree's `cfg`, rows that only pad the vocabulary are left out."""
  counts = collections.Counter()
  for path, leaf in _paths(tree):
    if path[-1] == moe_routing.BIAS:  # the routers' bias: state, not a parameter
      continue
    n = math.prod(leaf.shape)
    counts[component_of(path)] += n
    if path[0] in STACKS:
      counts["blocks"] += n
  for component, n in (vocab_padding(cfg) if cfg is not None else {}).items():
    counts[component] -= n
  return dict(counts)


# ----------------------------------------------------------------------------- analytic formula
@functools.cache
def _norm(c: ModelConfig) -> int:
  """Parameters of one norm over d_model (modules/norms.py: each kind has its own)."""
  x = jnp.zeros((1, c.d_model), dtype_of(c.dtype))
  shapes = jax.eval_shape(lambda: Norm(c).init(jax.random.PRNGKey(0), x))
  return sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(nn.unbox(shapes)))


def _mla(c: ModelConfig) -> int:
  """Multi-head latent attention's projections (modules/mla.py; its latent norms are norms)."""
  D, H, b = c.d_model, c.num_heads, int(c.use_bias)
  C, Q, K = c.kv_lora_rank, c.q_lora_rank, c.qk_nope_head_dim + c.qk_rope_head_dim
  query = (D * Q + b * Q + Q * H * K) if Q else D * H * K
  kv = (
      D * (C + c.qk_rope_head_dim)
      + b * (C + c.qk_rope_head_dim)
      + C * H * (c.qk_nope_head_dim + c.v_head_dim)
  )
  return query + kv + H * c.v_head_dim * D + b * D


def _attention(c: ModelConfig, cross: bool = False) -> int:
  """One attention sublayer's projections (self-attention multi-head latent with MLA)."""
  if c.mla and not cross:
    return _mla(c)
  D, H, G, K, b = c.d_model, c.num_heads, c.kv_heads, c.head_width, int(c.use_bias)
  bqkv = b if c.qkv_bias is None else int(c.qkv_bias)
  sinks = H * int(c.attention_sinks)  # one logit per query head (modules/sinks.py)
  return (D * H * K + bqkv * H * K) + 2 * (D * G * K + bqkv * G * K) + (H * K * D + b * D) + sinks


def _mtp(c: ModelConfig, active: bool = False) -> int:
  """Multi-token prediction's modules (models/mtp.py): per depth two input norms, the
  projection of both [2D -> D], a block and a final norm; embedding and head are the model's."""
  out = 0
  for k in range(c.mtp_depth):
    block = _attention(c) + FEED_FORWARDS[c.feed_forward].params(c, c.num_layers + k, active)
    block += sum(block_placement_params(c, False).values())
    out += 3 * _norm(c) + 2 * c.d_model * c.d_model + block
  return out


@functools.cache
def block_placement_params(c: ModelConfig, cross: bool) -> dict[str, int]:
  """The `norms` and `gains` of one Block, as the norm placement builds them: read off the
  Block's own parameter shapes (jax.eval_shape, nothing allocated), so a new placement needs no
  entry here."""
  block = Block(c.unrolled(), cross=cross)
  x = jnp.zeros((1, 2, c.d_model), dtype_of(c.dtype))
  kwargs = dict(positions=jnp.arange(2)[None], layer=0, **(dict(context=x) if cross else {}))
  shapes = jax.eval_shape(lambda: block.init(jax.random.PRNGKey(0), x, **kwargs))["params"]
  parts = tree_breakdown(nn.unbox(shapes))
  return {k: parts[k] for k in ("norms", "gains") if parts.get(k)}


def _lora(c: ModelConfig, cross: bool) -> int:
  """LoRA's parameters in one block: r * (inputs + outputs) per adapted projection."""
  D, H, G, K, F = c.d_model, c.num_heads, c.kv_heads, c.head_width, c.ff_width
  sizes = {"query": (D, H * K), "key": (D, G * K), "value": (D, G * K), "out": (H * K, D)}
  ffn_in, adapted = ("wi_0", "wi_1") if c.gated else ("wi",), lora.projections(c)
  sizes.update({name: (D, F) for name in ffn_in}, wo=(F, D))
  attention = sum(sum(sizes[n]) for n in ("query", "key", "value", "out") if n in adapted)
  ffn = sum(sum(sizes[n]) for n in (*ffn_in, "wo") if n in adapted)
  return c.lora_rank * (attention * (2 if cross else 1) + ffn)


def _stack(c: ModelConfig, layers: int, cross: bool, active: bool = False) -> dict[str, int]:
  out = {
      "attention": layers * (_attention(c) + (_attention(c, True) if cross else 0)),
      "feed_forward": sum(
          FEED_FORWARDS[c.feed_forward].params(c, i, active) for i in range(layers)
      ),
      "lora": layers * _lora(c, cross),
  }
  for component, n in block_placement_params(c, cross).items():
    out[component] = layers * n
  return out


def analytic_breakdown(cfg, active: bool = False) -> dict[str, int]:
  """Per-component counts from the formula (`active`: MoE counts top_k experts, not all)."""
  c = as_model_config(cfg)
  D, V, b = c.d_model, c.vocab_size, int(c.use_bias)
  out = collections.Counter()
  embedders = 2 if (c.family == "encoder_decoder" and not c.share_embeddings) else 1
  if c.family == "vit":
    out["patch_embedding"] = c.patch_size**2 * c.num_channels * D + b * D
    out["patch_embedding"] += D if c.pool == "cls" else 0
  else:
    out["token_embedding"] = embedders * V * D
  stack_embedders = 2 if c.stack_embeddings else embedders  # BART: positions and norm per stack
  scheme = position_scheme(c)  # its own counts, read off its shapes
  out["position_embedding"] = stack_embedders * scheme.embedding_params(c)
  out["type_embedding"] = stack_embedders * c.type_vocab_size * D
  out["norms"] = stack_embedders * _norm(c) * int(c.has_embed_norm)
  if c.embed_scale_learned and c.family != "vit":  # one learned scalar per token embedder
    out["gains"] = stack_embedders
  if c.family == "encoder_decoder":  # the decoder may have its own heads and width
    decoder = c.stack_config("decoder")
    stacks = [
        _stack(c, c.encoder_layers, False, active),
        _stack(decoder, c.decoder_layers, True, active),
    ]
    out["norms"] += 2 * _norm(c) * int(c.has_final_norm)
    causal = (False, True)
  else:
    stacks = [_stack(c, c.num_layers, False, active)]
    out["norms"] += _norm(c) * int(c.has_final_norm)
    causal = (c.family == "decoder",)
  configs = [c, c.stack_config("decoder")] if c.family == "encoder_decoder" else [c]
  for s, stack_cfg, stack_causal in zip(stacks, configs, causal):  # a bias's weights per stack
    s["position_bias"] = scheme.bias_params(stack_cfg, stack_causal)
  for s in stacks:
    for k, v in s.items():
      out[k] += v
      out["blocks"] += v
  head = c.head_kind
  unembed = 0 if c.tie_embeddings else V * D
  if head == "lm":
    out["head"] = unembed
  elif head == "pooler" or (head == "classifier" and c.family == "encoder"):
    out["head"] = D * D + b * D  # tanh(W h) pooler (encoder classifiers pool first; ViT does not)
  if head == "classifier":
    out["head"] += D * c.num_classes + b * c.num_classes
  if head == "mlm":
    out["head"] = D * D + b * D + _norm(c) + unembed + V
  if head in ("lm", "mlm") and has_logit_gain(c):  # the placement's gain per vocabulary entry
    out["gains"] += V
  out["mtp"] = _mtp(c, active)
  return {k: v for k, v in out.items() if v}


def lora_count(cfg) -> int:
  """What a LoRA run trains, by eval_shape: the adapters' parameters and those of the modules
  model.lora_modules_to_save trains in full; 0 without LoRA."""
  c = as_model_config(cfg)
  if not c.lora_rank:
    return 0
  trained = jax.tree_util.tree_leaves(lora_params.trainable(param_shapes(c), c))
  return sum(math.prod(x.shape) for x in trained)


def analytic_count(cfg, active: bool = False) -> int:
  return sum(v for k, v in analytic_breakdown(cfg, active).items() if k != "blocks")


def count(cfg, shapes=None) -> int:
  """Total parameters by `jax.eval_shape` of the model's init (nothing is allocated), less the
  rows that only pad the vocabulary. `shapes`: param_shapes(cfg), where the caller has them."""
  shapes = param_shapes(cfg) if shapes is None else shapes
  stored = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
  return stored - sum(vocab_padding(cfg).values()) - state_count(cfg)


def state_count(cfg) -> int:
  """Values in the parameter tree that are state, not parameters (DeepSeek-V3's routers'
  bias, modules/moe_routing.py): no count includes them."""
  return moe_routing.state_count(as_model_config(cfg))
