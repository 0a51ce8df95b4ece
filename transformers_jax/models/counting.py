"""Parameter and FLOP accounting: eval_shape counts, the analytic formula, per-component shares.

The analytic formula generalises the classic GPT-2 count
    V*d + ctx*d + L * (12 d^2 + 13 d) + 2 d
to every option of ModelConfig (GQA, separate head_dim, gated FFNs, MoE, biases, norm kinds and
placements, every family and head). Tests hold it equal to the eval_shape count, component by
component.

FLOPs convention (PaLM, Chowdhery et al. 2022, appendix B): training FLOPs per token
    6 * N + 12 * sum over attention layers of (H * K * keys attended)
where N counts the weights multiplied per token — the active parameters of every block plus the
output projection (unembedding, tied or not, and heads) — and excludes embedding *lookups*
(token, position, token-type tables), which cost no matmul. For MoE only the router and top_k
experts count. The attention term is 6 * 2 * H*K*S per layer (q.k and weights.v, forward and
backward); causal masking is not discounted, as in the paper.
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
from transformers_jax.modules import layer_types, lora
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


def _attention(c: ModelConfig) -> int:
  D, H, G, K, b = c.d_model, c.num_heads, c.kv_heads, c.head_width, int(c.use_bias)
  bqkv = b if c.qkv_bias is None else int(c.qkv_bias)
  return (D * H * K + bqkv * H * K) + 2 * (D * G * K + bqkv * G * K) + (H * K * D + b * D)


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
      "attention": layers * _attention(c) * (2 if cross else 1),
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
  return stored - sum(vocab_padding(cfg).values())


# ----------------------------------------------------------------------------- FLOPs
def matmul_params_per_token(cfg) -> int:
  """N of the 6N rule: active weights used in a matmul per token (lookups excluded)."""
  c = as_model_config(cfg)
  parts = analytic_breakdown(c, active=True)
  n = parts.get("attention", 0) + parts.get("feed_forward", 0) + parts.get("patch_embedding", 0)
  n += parts.get("lora", 0)
  n += parts.get("head", 0)
  if c.head_kind in ("lm", "mlm") and c.tie_embeddings:
    n += c.vocab_size * c.d_model  # the tied unembedding is still a matmul
  return n


def attended_keys(c, layers: int, seq_len: int) -> int:
  """Keys a query's scores are computed against, summed over `layers` causal blocks of a
  sequence of seq_len: the whole sequence in a full layer, at most model.sliding_window in a
  sliding one and model.attention_chunk in a chunked one (modules/layer_types.py), as the
  kernels compute them (each counts its whole band of keys, as a full layer counts all T)."""
  period, total = layer_types.pattern(c), 0
  for i in range(layers):
    kind = period[i % len(period)].attention
    limit = {"sliding": c.sliding_window, "chunked": c.attention_chunk}.get(kind) or seq_len
    total += min(seq_len, limit)
  return total


def flops_per_token(cfg, seq_len: int | None = None) -> int:
  """Training FLOPs per token (forward + backward): 6N + 12 * sum(H K S) over attention layers,
  S the keys each query attends (attended_keys: a window or chunk where a causal layer has
  one, else the sequence)."""
  c = as_model_config(cfg)
  T = seq_len or c.seq_len_max
  HK = c.num_heads * c.head_width
  if c.family == "encoder_decoder":
    decoder = c.stack_config("decoder")
    HK_dec = decoder.num_heads * decoder.head_width
    self_attn = HK_dec * attended_keys(decoder, c.decoder_layers, T)
    attn = T * (HK * c.encoder_layers + HK_dec * c.decoder_layers) + self_attn  # cross over T
  elif c.family == "decoder":
    attn = HK * attended_keys(c, c.num_layers, T)
  else:  # bidirectional stacks: windows and chunks apply to causal ones only
    attn = HK * T * c.num_layers
  return 6 * matmul_params_per_token(c) + 12 * attn


def summary(config) -> dict:
  """Everything `python -m transformers_jax.param_count` prints, for a full experiment config."""
  c = as_model_config(config.model)
  shapes = param_shapes(c)
  parts = tree_breakdown(shapes, c)
  total = sum(v for k, v in parts.items() if k != "blocks")
  published = config.get("published", {})
  # the tokens a sequence holds: a ViT's patches (and class token), whatever the config's text
  # seq_len says (tasks.classify's tokens_per_example, which training's MFU counts)
  seq = c.seq_len_max if c.family == "vit" else (config.get("seq_len", 0) or c.seq_len_max)
  ffn_share = parts.get("feed_forward", 0) / parts["blocks"] if parts.get("blocks") else 0.0
  return {
      "total": total,
      "analytic": analytic_count(c),
      "published": int(published.get("params", 0)) or None,
      "published_source": published.get("source", "") or None,
      # every component the parameters fall into (blocks overlap them): sums to the total
      "breakdown": {k: n for k, n in ordered(parts).items() if n and k != "blocks"},
      # trained by the optimizer: every parameter, or with LoRA the adapters only
      "trainable": lora_count(c) if c.lora_rank else total,
      "blocks": parts.get("blocks", 0),
      "blocks_share": parts.get("blocks", 0) / total,
      "feed_forward_share_of_blocks": ffn_share,
      "active_per_token": analytic_count(c, active=True),
      "flops_per_token": flops_per_token(c, seq),
      "flops_seq_len": seq,
      # the same at the model's own context (model.max_len; a ViT's patches), which a training
      # seq_len below it (GPT-3's presets train at 128 on a CPU, its context is 2,048) hides
      "context_len": c.seq_len_max,
      "flops_per_token_at_context": flops_per_token(c, c.seq_len_max),
      # a decoder with sliding or chunked layers: the same were every layer full (at seq)
      "flops_per_token_full_attention": _full_attention_flops(c, seq),
  }


def _full_attention_flops(c, seq_len: int) -> int | None:
  """A decoder's training FLOPs per token at seq_len were every layer to attend the whole
  sequence; None when no layer's window or chunk is shorter than seq_len."""
  if c.family != "decoder":
    return None
  saved = c.num_layers * seq_len - attended_keys(c, c.num_layers, seq_len)
  if not saved:
    return None
  return flops_per_token(c, seq_len) + 12 * c.num_heads * c.head_width * saved


def flops_text(s: dict) -> str:
  """summary()'s FLOPs per token in words, with the sequence length they are for: the config's
  seq_len and, where that differs, the model's own context too."""
  formula = "6N + 12*L*H*K*T, PaLM appendix B"
  full = s.get("flops_per_token_full_attention")
  if full:  # sliding or chunked layers attend their window of the T keys
    formula = (
        "6N + 12*H*K*(keys attended, summed over layers: T, or a layer's window or chunk), "
        f"PaLM appendix B; {full:.4g} at T = {s['flops_seq_len']:,} were every layer full"
    )
  if s["flops_seq_len"] == s["context_len"]:
    return (
        f"{s['flops_per_token']:.4g} ({formula}, T = {s['flops_seq_len']:,}, the model's context)"
    )
  return (
      f"{s['flops_per_token']:.4g} at T = {s['flops_seq_len']:,} (the config's seq_len), "
      f"{s['flops_per_token_at_context']:.4g} at the model's context T = {s['context_len']:,} "
      f"({formula})"
  )
