"""What a position scheme is: the `PositionScheme` base class, the `ScoreBias` it may hand to
attention, and the parameter counts every scheme's entry derives from its own shapes.

A scheme may do any of three things, and the model asks it at each place:
  * add to the embeddings (`embedding_table`, `add_to_embeddings`: learned, sinusoidal);
  * rotate queries and keys of self-attention (`rotate`: RoPE);
  * give every self-attention a score bias b(query position, key position, head), added to
    q.k / sqrt(K) before the softmax (`score_bias` makes its weights, `bias_scores` is its
    formula: T5's bucketed relative bias, ALiBi). The bias is a `ScoreBias`, a pytree that
    every attention path evaluates for the pairs it scores (einsum and the fused call whole,
    flash per block, the KV cache per slot, the context axis per shard or ring step), so no
    path needs to know which scheme made it.
Stacks make the bias once and hand it to each block (T5 shares one table across the layers of
a stack); cross-attention never takes one.

Parameters a scheme owns follow two rules, so that counts and breakdowns derive from the model
itself: an embedding table is the embedder's `pos_embed` (component `position_embedding`), and
a score bias's weights are made in the stack's scope with names ending in `_bias` (`bias_param`;
component `position_bias`).
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.modules.common import dtype_of


@flax.struct.dataclass
class ScoreBias:
  """An additive attention-score bias as a function of query and key positions.

  `weights`: T5's table [num_buckets, H] (learned) or ALiBi's slopes [H] (constants); `kind`:
  the name of the position scheme (POSITION_SCHEMES) whose `bias_scores` is its formula. Called
  with q_positions [B or 1, T] and k_positions [B or 1, S], it returns [B or 1, H, T, S]
  float32. A pytree: it passes through jit, scan, remat, shard_map and custom VJPs like an
  array; its weights always end with the heads axis (what a split over heads slices)."""

  weights: jax.Array
  kind: str = flax.struct.field(pytree_node=False, default="t5")
  bidirectional: bool = flax.struct.field(pytree_node=False, default=True)
  max_distance: int = flax.struct.field(pytree_node=False, default=128)

  @property
  def num_heads(self) -> int:
    return self.weights.shape[-1]

  def __call__(self, q_positions, k_positions):
    from transformers_jax.modules.positions import POSITION_SCHEMES  # the registry, its package's

    relative = k_positions[:, None, :] - q_positions[:, :, None]  # [B, T, S]
    return POSITION_SCHEMES[self.kind].bias_scores(self, relative)

  def block(self, q_positions, k_positions, groups: int):
    """The bias laid out as grouped-query attention reads it: [B or 1, G, H/G, T, S]."""
    b = self(q_positions, k_positions)
    return b.reshape(b.shape[0], groups, self.num_heads // groups, *b.shape[2:])


def index_positions(length: int, start=0):
  """Positions start, start + 1, … as a [1, length] int32 array (a sequence in index order)."""
  return (start + jnp.arange(length, dtype=jnp.int32))[None]


def bias_param(stack: nn.Module, c, name: str, init, shape: tuple[int, ...]):
  """A score bias's learned weights `name` (must end in `_bias`) in the stack's scope."""
  assert name.endswith("_bias"), name
  return stack.param(name, init, shape, dtype_of(c.param_dtype))


class PositionScheme:
  """Base class of every `model.positions` entry; as it stands, no positional information
  (`none`). Subclasses override what applies of `embedding_table` and `add_to_embeddings`,
  `rotate`, `score_bias` with `bias_scores`, and `config_problem`, and set `summary`."""

  summary = ""  # one line on what it is (--config_help, docs/config.md, docs/architecture.md)

  def embedding_table(self, c):
    """The embedder's learned table (an nn.Module made in its setup), or None."""
    return None

  def add_to_embeddings(self, c, x, positions, table):
    return x

  def rotate(self, c, q, k, positions):
    return q, k

  def score_bias(self, c, stack: nn.Module, causal: bool) -> ScoreBias | None:
    """The bias a stack's self-attentions add (weights made in `stack`: bias_param), or None."""
    return None

  def bias_scores(self, bias: ScoreBias, relative):
    """The bias [B or 1, H, T, S] float32 of `bias` at the offsets `relative` = key position -
    query position [B or 1, T, S] (int32): the formula of a scheme with a score bias."""
    raise NotImplementedError

  @property
  def has_score_bias(self) -> bool:
    return type(self).score_bias is not PositionScheme.score_bias

  def config_problem(self, c) -> tuple[str, str, str] | None:
    """(field, value, fix) of the first setting the scheme cannot work with, or None;
    subclasses add their own after this one's."""
    if self.has_score_bias and c.attention_impl == "splash":
      return (
          "attention_impl",
          "'splash'",
          f"splash's kernel takes no score bias (model.positions={c.positions}): use flash, or "
          "auto (which runs flash for it)",
      )
    return None

  # The parameter counts models/counting.py takes, read off the scheme's own shapes
  # (jax.eval_shape, nothing allocated): a new scheme needs no entry there.
  def embedding_params(self, c) -> int:
    """Parameters of one embedder's table for this scheme (its `pos_embed`)."""
    return _shape_count(self, c, None)

  def bias_params(self, c, causal: bool) -> int:
    """Parameters one stack's score bias holds (causal: a decoder's stack)."""
    return _shape_count(self, c, causal)


class _Embeddings(nn.Module):
  """What the embedder does with a scheme: its table made in setup, added to x."""

  cfg: "ModelConfig"  # noqa: F821
  scheme: PositionScheme

  def setup(self):
    self.pos_embed = self.scheme.embedding_table(self.cfg)

  def __call__(self, x, positions):
    return self.scheme.add_to_embeddings(self.cfg, x, positions, self.pos_embed)


class _StackBias(nn.Module):
  """What a stack does with a scheme: its score bias made in the stack's scope."""

  cfg: "ModelConfig"  # noqa: F821
  scheme: PositionScheme
  causal: bool

  @nn.compact
  def __call__(self):
    return self.scheme.score_bias(self.cfg, self, self.causal)


@functools.cache
def _shape_count(scheme: PositionScheme, c, causal: bool | None) -> int:
  """Parameters of the scheme's embedding table (causal None) or of one stack's score bias."""
  key = jax.random.PRNGKey(0)
  if causal is None:
    if scheme.embedding_table(c) is None:
      return 0
    x = jnp.zeros((1, 2, c.d_model), dtype_of(c.dtype))
    positions = jnp.zeros((1, 2), jnp.int32)
    init = lambda: _Embeddings(c, scheme).init(key, x, positions)  # noqa: E731
  else:
    init = lambda: _StackBias(c, scheme, causal).init(key)  # noqa: E731
  shapes = nn.unbox(jax.eval_shape(init)).get("params", {})
  return sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))


class DecodeCounter(nn.Module):
  """Positions of the tokens fed in this decode call: [index, index + T); advances the index."""

  @nn.compact
  def __call__(self, batch: int, length: int):
    initialised = self.has_variable("cache", "index")
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    start = index.value
    if initialised:
      index.value = start + length
    return jnp.broadcast_to(start + jnp.arange(length, dtype=jnp.int32), (batch, length))
