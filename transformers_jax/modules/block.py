"""The one Block every family is built from, and the Stack that repeats it (looped or scanned)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformers_jax.modules.attention import Attention
from transformers_jax.modules.common import constant, dtype_of
from transformers_jax.modules.feed_forward import FEED_FORWARDS
from transformers_jax.modules.masks import AttentionMask, is_causal, with_pattern
from transformers_jax.modules.mla import MLA
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.placement_base import Depth, Site
from transformers_jax.modules import inits, layer_types, parametrization, pipeline, remat
from transformers_jax.modules.placements import PLACEMENTS
from transformers_jax.modules.positions import position_scheme


class Block(nn.Module):
  """Self-attention, optional cross-attention, feed-forward; each a residual sublayer, wired by
  the norm placement `model.norm_placement` names (modules/placements/: where the norms sit,
  what multiplies the skip path or the branch, the init rules). Its norms are named
  `<sublayer>_norm...`, its gains `<sublayer>_..._gain`, for sublayers self_attn, cross_attn
  and ffn. Sows `intermediates/residual_rms`, the RMS of the residual stream leaving the block.

  `x` is the residual stream: [B, T, D], or [B, T, n, D] for a placement with n streams (a
  [B, T, D] input is copied n times: `Placement.enter`), returned in the placement's shape.
  With model.value_residual the block takes and returns (stream, V_1), V_1 [B, T, G, K] the
  stack's first-block self-attention values (Attention._value_residual; an input without
  V_1 makes this block the first, whatever its index).
  """

  cfg: "ModelConfig"  # noqa: F821
  causal: bool = False
  cross: bool = False
  moe: bool = False
  deterministic: bool = True
  decode: bool = False
  scanned: bool = False  # return (x, None) as nn.scan's body
  layer: int | None = None  # index in a looped stack; under nn.scan, the call's `layer` input
  num_layers: int = 1  # blocks in this stack
  role: str = "single"  # single | encoder | decoder (the stacks of an encoder-decoder)

  def gain_param(self, name, shape, value, names):
    """A placement's learned gain (placement_base.Site.gain)."""
    return self.param(name, constant(value, names), shape, dtype_of(self.cfg.param_dtype))

  def window(self, index, causal: bool):
    """This block's sliding window (modules/layer_types.py: model.sliding_window on its sliding
    blocks of a causal pattern), None where it attends every earlier key; traced under a scan
    over layers where the blocks differ."""
    return layer_types.layer_attention(self.cfg, index, causal).window

  def depth(self, layer) -> Depth:
    c = self.cfg
    other = {"encoder": c.decoder_layers, "decoder": c.encoder_layers}.get(self.role, 0)
    index = self.layer if self.layer is not None else layer
    return Depth(index, self.num_layers, self.role, other)

  @nn.compact
  def __call__(
      self, x, mask=None, positions=None, context=None, context_mask=None, bias=None, layer=None
  ):
    c = self.cfg
    placement = PLACEMENTS[c.norm_placement]
    depth = self.depth(layer)
    first_values = None
    if c.value_residual and isinstance(x, tuple):
      x, first_values = x
    x = placement.enter(c, x)
    first = True if first_values is None else depth.layer == 0
    carried = {}  # the V_1 the self-attention returns
    # every placement passes each residual branch through the site's dropout, which also
    # applies the parametrisation's branch multiplier (CompleteP's L_base / L)
    branch = parametrization.of(c).branch_multiplier(c, depth.num_layers)

    def branch_out(y):
      y = nn.Dropout(c.dropout, deterministic=self.deterministic)(y)
      return y if branch == 1.0 else y * jnp.asarray(branch, y.dtype)

    site = Site(self, depth, make_norm=lambda name: Norm(c, name=name), dropout=branch_out)

    def parts(sublayer):  # what the placement sets inside each sublayer
      rules = inits.projection_rules(c, depth, sublayer)  # model.init's, then the placement's
      return dict(init_rules=tuple(sorted(rules.items())), features=placement.features)

    kw = dict(cfg=c, deterministic=self.deterministic, decode=self.decode)
    # what each query may attend is the mask's (modules/masks.py; the Stack sets the pattern),
    # the block's `causal` only where a caller passes none
    # and this block's own window, chunks and RoPE frequencies (model.layer_types)
    layer = layer_types.layer_attention(c, depth.layer, is_causal(mask, self.causal))

    def self_attn(h):
      if c.mla:  # multi-head latent attention: modules/mla.py (its config_problem: what it takes)
        latent = MLA(causal=self.causal, name="self_attn", **kw, **parts("self_attn"))
        return latent(h, mask=mask, positions=positions, bias=bias, window=layer.window)
      attention = Attention(
          causal=self.causal,
          name="self_attn",
          value_residual=c.value_residual,
          **kw,
          **parts("self_attn"),
      )
      args = dict(mask=mask, positions=positions, bias=bias, window=layer.window, layer=layer)
      if not c.value_residual:
        return attention(h, **args)
      y, carried["first_values"] = attention(h, first_values=first_values, first=first, **args)
      return y

    sublayers = [("self_attn", self_attn)]
    if self.cross:
      sublayers.append(
          (
              "cross_attn",
              lambda h: Attention(name="cross_attn", **kw, **parts("cross_attn"))(
                  h, context=context, mask=context_mask
              ),
          )
      )
    # the feed-forward kind's module (modules/feed_forward.py's registry)
    ffn = FEED_FORWARDS[c.feed_forward].module(
        c, self.moe, self.deterministic, name="ffn", **parts("ffn")
    )
    sublayers.append(("ffn", ffn))
    x = placement.block(site, x, sublayers)
    names = ("act_batch", "act_length") + (None,) * (x.ndim - 3) + ("act_embed",)
    x = nn.with_logical_constraint(x, names)
    self.sow("intermediates", "residual_rms", jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32)))))
    if c.value_residual:
      x = (x, carried["first_values"])
    return (x, None) if self.scanned else x


class Stack(nn.Module):
  """`num_layers` Blocks: a Python loop (`layer_0` … `layer_{L-1}`) or nn.scan (`layers`,
  every parameter with a leading `layers` axis, the block index a scanned input), with the
  config's remat policy. Blocks of different kinds (an MoE model's first dense blocks,
  model.moe_first_dense) are scanned in runs, one per kind: `layers` from block 0, then
  `layers_from_<n>` from block n (scan_runs). `role` tells the blocks which stack of an encoder-decoder they are in
  (norm placements whose constants depend on both depths read it). A position scheme's score
  bias (modules/positions.py) is made here, once, and every block's self-attention adds it.
  The stream enters the blocks as the placement carries it (n copies for hyper-connections) and
  leaves as [B, T, D]; with model.value_residual the carry also holds the first block's values
  (under nn.scan: zeros of their shape before the first block, which does not read them)."""

  cfg: "ModelConfig"  # noqa: F821
  num_layers: int
  causal: bool = False
  cross: bool = False
  deterministic: bool = True
  decode: bool = False
  role: str = "single"

  @nn.compact
  def __call__(self, x, mask=None, positions=None, context=None, context_mask=None):
    c = self.cfg
    if self.is_mutable_collection("profile"):  # placements profiled at init read this
      self.sow("profile", "input_var", jnp.var(x.astype(jnp.float32)))
    block = Block
    if c.remat != "none":
      block = nn.remat(Block, policy=remat.policy(c), prevent_cse=not c.scan_layers)
    kw = dict(
        cfg=c,
        causal=self.causal,
        cross=self.cross,
        deterministic=self.deterministic,
        decode=self.decode,
        num_layers=self.num_layers,
        role=self.role,
    )
    bias = position_scheme(c).score_bias(c, self, self.causal)
    if mask is None or isinstance(mask, AttentionMask):  # the stack's pattern, as data
      mask = with_pattern(mask, self.causal or is_causal(mask))
    args = (mask, positions, context, context_mask, bias)
    placement = PLACEMENTS[c.norm_placement]
    x = placement.enter(c, x)  # n copies of the stream for hyper-connections
    if c.value_residual:  # (stream, V_1): the first block replaces these zeros with its values
      B, T = x.shape[:2]
      x = (x, jnp.zeros((B, T, c.kv_heads, c.head_width), dtype_of(c.dtype)))
    if c.scan_layers and self.pipelined():  # one run of blocks (pipeline.config_problem)
      x = self.pipeline(x, args, kw)
    elif c.scan_layers:
      for start, length in scan_runs(c, self.num_layers):
        body = nn.scan(
            block,
            variable_axes={
                "params": 0,
                "intermediates": 0,
                "losses": 0,
                "moe_stats": 0,
                "cache": 0,
                "profile": 0,
            },
            split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast,) * len(args) + (0,),
            length=length,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        layers = jnp.arange(start, start + length, dtype=jnp.int32)
        run = body(moe=c.is_moe_layer(start), scanned=True, name=run_name(start), **kw)
        x, _ = run(x, *args, layers)
    else:
      for i in range(self.num_layers):
        x = block(moe=c.is_moe_layer(i), layer=i, name=f"layer_{i}", **kw)(x, *args)
    if c.value_residual:
      x, _ = x
    return placement.leave(c, x)

  def pipelined(self) -> bool:
    """Whether the scanned blocks run as a pipeline: under a mesh with `stage` > 1, in a forward
    pass that is not the initialisation (which makes the ordinary scanned parameters) or a
    KV-cache decode (which runs the scan over the stage-split parameters)."""
    return pipeline.stage_count() > 1 and not self.decode and not self.is_initializing()

  def pipeline(self, x, args, kw):
    """The blocks as a pipeline over the mesh's stages (modules/pipeline.py), each block the
    scanned stack's own (its parameters, its index, the remat policy); what they sow is put
    where the scan puts it (`layers`, one value per block)."""
    c = self.cfg
    mask, positions, context, context_mask, bias = args
    params = nn.unbox(self.variables["params"]["layers"])
    sown = [col for col in pipeline.SOWN if self.is_mutable_collection(col)]
    unit = Block(moe=c.is_moe_layer(0), scanned=True, **kw)
    rng = jax.random.key(0) if self.deterministic else self.make_rng("dropout")

    def layer(p, h, inputs, index, key):
      rngs = {} if self.deterministic else {"dropout": key}
      (h, _), state = unit.apply({"params": p}, h, *inputs, bias, index, rngs=rngs, mutable=sown)
      return h, state

    if c.remat != "none":
      layer = jax.checkpoint(layer, policy=remat.policy(c), prevent_cse=False)
    batch = jax.tree_util.tree_leaves(x)[0].shape[0]
    per_row = (mask, positions, context, context_mask)
    x, sows = pipeline.run(c, layer, params, x, per_row, batch, rng)
    for collection, tree in sows.items():
      self.put_variable(collection, "layers", tree)
    return x


def scan_runs(c, num_layers: int) -> list[tuple[int, int]]:
  """(first block, blocks) of each run of consecutive blocks of one kind (dense or MoE), which a
  scanned stack scans one at a time."""
  runs = []
  for i in range(num_layers):
    if runs and c.is_moe_layer(i) == c.is_moe_layer(runs[-1][0]):
      runs[-1][1] += 1
    else:
      runs.append([i, 1])
  return [tuple(r) for r in runs]


def run_name(start: int) -> str:
  """The subtree of the scanned run of blocks from block `start`."""
  return "layers" if start == 0 else f"layers_from_{start}"


def run_start(name: str) -> int | None:
  """The first block of the scanned run `name` holds (`run_name`), None for any other name."""
  if name == "layers":
    return 0
  tail = name.removeprefix("layers_from_")
  return int(tail) if tail != name and tail.isdigit() else None


def scan_to_loop(tree):
  """Convert a parameter (or any variable) tree from the scanned layout to the looped one.

  Every `layers` (`layers_from_<n>`) subtree, whose leaves carry a leading layer axis, becomes
  `layer_0` … (`layer_<n>` …). Works on plain arrays; call `nn.unbox` first on boxed
  (partitioned) trees.
  """
  if not isinstance(tree, dict):
    return tree
  out = {}
  for key, value in tree.items():
    start = run_start(key)
    if start is not None and isinstance(value, dict):
      n = jax.tree_util.tree_leaves(value)[0].shape[0]
      for i in range(n):
        out[f"layer_{start + i}"] = jax.tree_util.tree_map(lambda a, i=i: a[i], value)
    else:
      out[key] = scan_to_loop(value)
  return out


def _kind(tree):
  """What makes blocks stack together: the same tree of the same shapes."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple(getattr(leaf, "shape", None) for leaf in leaves)


def loop_to_scan(tree):
  """Inverse of `scan_to_loop`: stack `layer_0` … `layer_{L-1}` into one `layers` subtree, or,
  where blocks differ in kind (dense and MoE), each run of one kind into its own (`run_name`)."""
  if not isinstance(tree, dict):
    return tree
  layer_keys = sorted((k for k in tree if _is_layer_name(k)), key=lambda k: int(k[6:]))
  out = {k: loop_to_scan(v) for k, v in tree.items() if k not in layer_keys}
  if layer_keys:
    if [int(k[6:]) for k in layer_keys] != list(range(len(layer_keys))):
      raise ValueError(f"layers are not numbered 0..{len(layer_keys) - 1}: {layer_keys}")
    runs = []
    for i, key in enumerate(layer_keys):
      if runs and _kind(tree[key]) == _kind(tree[layer_keys[runs[-1][0]]]):
        runs[-1][1] = i + 1
      else:
        runs.append([i, i + 1])
    for start, end in runs:
      parts = (tree[layer_keys[i]] for i in range(start, end))
      out[run_name(start)] = jax.tree_util.tree_map(_stack, *parts)
  return out


def _stack(*blocks):
  """One tensor of every block, stacked on a new leading axis: on the host (numpy) where all are
  host arrays, as a checkpoint or Hugging Face file reads them (no device copy, no compile),
  else on the device."""
  if all(isinstance(x, np.ndarray) for x in blocks):
    return np.stack(blocks)
  return jnp.stack(blocks)


def _names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _is_layer_name(name: str) -> bool:
  return name.startswith("layer_") and name[6:].isdigit()


def stacked_blocks(tree) -> bool | None:
  """Whether a tree (parameters, a train state, a checkpoint's metadata) holds its blocks
  scanned (a `layers` subtree: True) or looped (`layer_0` …: False); None when it has none."""
  names = {
      name for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0] for name in _names(path)
  }
  if any(run_start(name) is not None for name in names):
    return True
  return False if any(_is_layer_name(name) for name in names) else None


def in_layout(params, scan: bool):
  """One model's parameter tree (dicts of arrays) with its blocks scanned (`scan`) or looped,
  whichever layout it is in."""
  return loop_to_scan(params) if scan else scan_to_loop(params)


def relayout(tree, like, axis: int = 0):
  """`tree` (any pytree: a train state, a population's) with its blocks in the other layout,
  that of `like` (the same tree's abstract twin with scan_layers flipped): a leaf under
  `layer_i` in `like` is slice i, on `axis`, of the leaf under `layers` in `tree`; one under
  `layers` is the `layer_i` leaves stacked on `axis`; any other leaf is taken as it is. `axis`
  is 1 under a population's leading member axis. (Jit it, with the new layout's shardings.)"""
  flat = {_names(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  runs = {}  # (names without the run's, its position) -> [(first block, stacked leaf)]
  for key, stacked in flat.items():
    for i, name in enumerate(key):
      if run_start(name) is not None:
        runs.setdefault((key[:i] + key[i + 1 :], i), []).append((run_start(name), stacked))

  def take(path, leaf):
    names = _names(path)
    if names in flat:
      return flat[names]
    at = next((i for i, name in enumerate(names) if run_start(name) is not None), None)
    if at is not None:  # a run of `leaf.shape[axis]` blocks from its first
      start, parts = run_start(names[at]), []
      for i in range(start, start + leaf.shape[axis]):
        key = names[:at] + (f"layer_{i}",) + names[at + 1 :]
        if key not in flat:
          break
        parts.append(flat[key])
      if len(parts) == leaf.shape[axis]:
        return jnp.stack(parts, axis)
    at = next((i for i, name in enumerate(names) if _is_layer_name(name)), None)
    index = None if at is None else int(names[at][6:])
    # the run holding block `index`: the latest to start at or before it
    found = [r for r in runs.get((names[:at] + names[at + 1 :], at), ()) if r[0] <= index]
    if not found:
      raise ValueError(f"{'/'.join(names)}: no such tensor in either layout of the blocks")
    start, stacked = max(found, key=lambda r: r[0])
    return jnp.take(stacked, index - start, axis)

  return jax.tree_util.tree_map_with_path(take, like)
