"""What a norm placement is made of: the `Placement` base class and the `Site` it wires.

A placement (`model.norm_placement`, entries in modules/placements/) decides, for one Block,
where the norms sit around each residual sublayer (self-attention, cross-attention,
feed-forward), what multiplies the skip path or the branch, which norms or gains live inside
the sublayers, and any initialisation rule the scheme needs. The Block hands it a `Site` (its
scope, the block's depth in its stack) and a list of sublayers; the placement returns the new
residual stream.

Parameters a placement owns follow two naming rules, so that counts and breakdowns derive from
the model itself: norms have `norm` in their name (component `norms`), and gains on the skip
path, the branch or the heads end in `_gain` (component `gains`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

# Features a placement can ask the sublayers for (Attention and FeedForward read them):
QKV_NORM = "qkv_norm"  # a norm on the whole query, key and value projections (HybridNorm)
ATTENTION_OUT_NORM = "attention_out_norm"  # a norm on the heads' output before `out` (Sub-LN)
HEAD_GAIN = "head_gain"  # a learned gain per head before `out`, initialised to 1 (NormFormer)
FFN_MID_NORM = "ffn_mid_norm"  # a norm on the hidden activations before `wo` (NormFormer, Sub-LN)
# queries and keys of each head put on the unit sphere (after any rotation), the queries scaled
# by a learned gain per head and width, the scores by sqrt(head_dim) rather than its inverse (nGPT)
QK_SPHERE = "qk_sphere"
FFN_SCALES = "ffn_scales"  # learned gains on the FFN's hidden projections (nGPT's s_u, s_v)
LOGIT_GAIN = "logit_gain"  # a learned gain per vocabulary entry on the logits (nGPT's s_z)
FEATURES = (
    QKV_NORM,
    ATTENTION_OUT_NORM,
    HEAD_GAIN,
    FFN_MID_NORM,
    QK_SPHERE,
    FFN_SCALES,
    LOGIT_GAIN,
)

# Projections an initialisation rule can name, per sublayer kind.
ATTENTION_PROJECTIONS = ("query", "key", "value", "out")
FFN_PROJECTIONS = ("wi", "wi_0", "wi_1", "wo")  # gated FFNs have wi_0 and wi_1; MoE experts too


@dataclasses.dataclass(frozen=True)
class Depth:
  """Where a block sits: `layer` (0-based, a Python int in a looped stack, a traced scalar under
  nn.scan), `num_layers` of its stack, and `role`: `single` (decoder-only, encoder-only, ViT),
  or `encoder` / `decoder` of an encoder-decoder, whose other stack has `other_layers`."""

  layer: int | jax.Array
  num_layers: int
  role: str = "single"
  other_layers: int = 0

  @property
  def static(self) -> bool:
    return isinstance(self.layer, int)


class Site:
  """What a placement may use of the Block it wires: the config, the block's `depth`, norms and
  parameters created in the block's scope, dropout on a branch, and the residual sum (which
  drops the skip path when `model.residual=False`)."""

  def __init__(self, block, depth: Depth, make_norm: Callable, dropout: Callable):
    self.block = block
    self.cfg = block.cfg
    self.depth = depth
    self._make_norm = make_norm
    self.dropout = dropout

  def norm(self, name: str):
    """A norm of the config's kind (`model.norm`) named `name` in the block."""
    return self._make_norm(name)

  def gain(self, name: str, shape: tuple[int, ...], value):
    """A learned gain `name` (must end in `_gain`) of `shape`, initialised to `value` (a number,
    or an array broadcast to `shape`; under nn.scan it may depend on the traced block index)."""
    assert name.endswith("_gain"), name
    names = ("embed",) if shape == (self.cfg.d_model,) else (None,) * len(shape)
    return self.block.gain_param(name, shape, value, names)

  def add(self, skip, branch):
    """skip + branch, or the branch alone without residual connections."""
    return skip + branch if self.cfg.residual else branch


@dataclasses.dataclass(frozen=True)
class Init:
  """An initialiser for a projection's kernel: Xavier (Glorot) `normal` or `uniform` over the
  kernel's fan-in and fan-out, times `gain` (PyTorch's xavier_normal_/xavier_uniform_ gain);
  or `std`: a normal distribution whose standard deviation is `gain`, whatever the fans.

  `fan_divisors` (fan-in's, fan-out's) make Xavier's variance the one of a kernel whose fans
  are the actual ones divided by them: μP keeps a fixed-by-wide tensor at its base width's
  variance that way (modules/parametrization.py). `std` ignores them."""

  distribution: str  # normal | uniform | std
  gain: float = 1.0
  fan_divisors: tuple[float, float] = (1.0, 1.0)

  def initializer(self, in_axis=-2, out_axis=-1, batch_axis=()):
    if self.distribution == "std":
      return jax.nn.initializers.normal(self.gain)
    if self.fan_divisors == (1.0, 1.0):
      return jax.nn.initializers.variance_scaling(
          self.gain**2, "fan_avg", self.distribution, in_axis, out_axis, batch_axis
      )

    def at_divided_fans(key, shape, dtype=jnp.float32):
      fan_in, fan_out = kernel_fans(shape, in_axis, out_axis, batch_axis)
      divided = fan_in / self.fan_divisors[0] + fan_out / self.fan_divisors[1]
      scale = self.gain**2 * (fan_in + fan_out) / divided  # fan_avg's 2/(in+out) -> 2/divided
      return jax.nn.initializers.variance_scaling(
          scale, "fan_avg", self.distribution, in_axis, out_axis, batch_axis
      )(key, shape, dtype)

    return at_divided_fans


def kernel_fans(shape, in_axis=-2, out_axis=-1, batch_axis=()) -> tuple[float, float]:
  """(fan-in, fan-out) of a kernel of `shape` as jax.nn.initializers.variance_scaling reads
  them: the in and out axes' sizes, each times the remaining (receptive field) axes'."""
  ndim = len(shape)
  axes = lambda a: {i % ndim for i in (a if isinstance(a, (tuple, list)) else (a,))}  # noqa: E731
  ins, outs, batch = axes(in_axis), axes(out_axis), axes(batch_axis)
  receptive = math.prod(shape[i] for i in range(ndim) if i not in ins | outs | batch)
  return (
      math.prod(shape[i] for i in ins) * receptive,
      math.prod(shape[i] for i in outs) * receptive,
  )


Sublayer = tuple[str, Callable]  # (name: self_attn | cross_attn | ffn, branch function f(h))


class Placement:
  """Base class of every `model.norm_placement` entry. Subclasses override `sublayer` (one
  residual sublayer at a time) or `block` (schemes that wire the block as a whole), and set the
  class attributes that apply."""

  summary: str = ""  # one line on what it is (--config_help, docs/config.md, docs/architecture.md)
  final_norm: bool = False  # whether `model.final_norm=None` puts a norm after the last block
  features: tuple[str, ...] = ()  # FEATURES the sublayers add for this placement
  # `model.norm_placement_arg`: what it means here ("" = this placement takes none) and its
  # default (the paper's value)
  arg_meaning: str = ""
  arg_default: float | None = None
  uses_norms: bool = True  # False: the scheme has no norm in its blocks (model.norm unused)
  profiled: bool = False  # True: `profile` sets parameters from one forward pass at init
  unavailable: str = ""  # why the scheme cannot be built (validation refuses it with this)
  # `model.init=paper`: the initialisation its paper trained with (a name of modules/inits.py's
  # registry, under the placement's own projection_init), and where that is written
  paper_init: str = "gpt2"
  paper_init_source: str = ""
  embed_norm: bool = False  # a norm right after the embeddings, whatever model.embed_norm says
  # the model fields (of PLACEMENT_FIELDS) this placement reads; the others must keep their
  # defaults (validation refuses a setting nothing reads)
  reads: tuple[str, ...] = ()

  def streams(self, cfg) -> int:
    """How many copies of the residual stream the blocks carry: 1 ([B, T, D]), or n > 1 for
    hyper-connections ([B, T, n, D], `enter` and `leave` convert)."""
    del cfg
    return 1

  def enter(self, cfg, x):
    """The stack's input [B, T, D] as the blocks carry it (a stream already entered is left as
    it is)."""
    n = self.streams(cfg)
    if n == 1 or x.ndim == 4:
      return x
    return jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], n, x.shape[-1]))

  def leave(self, cfg, x):
    """The last block's output back to [B, T, D]: the n streams summed."""
    return x.sum(-2) if self.streams(cfg) > 1 else x

  def constraint(self, cfg) -> Callable | None:
    """A function params -> params that the training update applies after every optimizer step
    (and `models.initializer` once to the initial parameters), or None. It receives one model's
    parameters as plain arrays, blocks looped or scanned (a `layers` axis first)."""
    del cfg
    return None

  def config_problem(self, cfg) -> tuple[str, str, str] | None:
    """(field, value, fix) of a setting this placement cannot work with, or None."""
    del cfg
    return None

  def block(self, site: Site, x, sublayers: list[Sublayer]):
    for name, fn in sublayers:
      x = self.sublayer(site, x, name, fn)
    return x

  def sublayer(self, site: Site, x, name: str, fn: Callable):
    raise NotImplementedError

  def projection_init(self, cfg, depth: Depth, sublayer: str) -> dict[str, Init]:
    """Initialisers of the sublayer's projections, by name (ATTENTION_PROJECTIONS,
    FFN_PROJECTIONS); projections left out keep `normal(model.init_std)`."""
    del cfg, depth, sublayer
    return {}

  def token_embedding_std(self, cfg) -> float | None:
    """The token embedding's initial standard deviation, or None for `model.init_std`."""
    del cfg
    return None

  def profile(self, params: dict, profiled: dict, cfg) -> dict:
    """Parameters set from one forward pass at initialisation: `profiled` is the `profile`
    collection the blocks sowed (see `profiled`)."""
    del profiled, cfg
    return params

  def arg(self, cfg) -> float | None:
    return self.arg_default if cfg.norm_placement_arg is None else cfg.norm_placement_arg


# Model fields that only some placements read (`Placement.reads`), with their defaults.
PLACEMENT_FIELDS = {"residual_streams": 4, "hyper_dynamic": False}


def config_problem(c, placement: Placement) -> tuple[str, str, str] | None:
  """(field, value, fix) of the first setting `placement` cannot work with, or None."""
  if placement.unavailable:
    return "norm_placement", repr(c.norm_placement), placement.unavailable
  for field, default in PLACEMENT_FIELDS.items():
    if getattr(c, field) != default and field not in placement.reads:
      fix = f"norm_placement={c.norm_placement} does not read it: leave it at {default}"
      return field, repr(getattr(c, field)), fix
  own = placement.config_problem(c)
  if own:
    return own
  arg = c.norm_placement_arg
  if arg is not None and not placement.arg_meaning:
    fix = f"norm_placement={c.norm_placement} takes no argument: leave it unset (None)"
    return "norm_placement_arg", str(arg), fix
  if arg is not None and c.norm_placement == "mixln" and not 0 <= arg <= 1:
    return "norm_placement_arg", str(arg), "mixln's alpha must be in [0, 1]"
  if arg is not None and c.norm_placement != "mixln" and arg <= 0:
    return "norm_placement_arg", str(arg), "must be positive"
  if FFN_MID_NORM in placement.features and c.feed_forward == "moe" and c.moe_impl == "ragged":
    fix = (
        f"norm_placement={c.norm_placement} puts a norm inside the experts, which only the "
        "dense experts have: use model.moe_impl=dense"
    )
    return "moe_impl", "'ragged'", fix
  return None


def stack_depths(cfg) -> dict[str, tuple[int, int, str]]:
  """{stack name in the parameter tree: (its layers, the other stack's layers, role)}."""
  if cfg.family == "encoder_decoder":
    n, m = cfg.encoder_layers, cfg.decoder_layers
    return {"encoder": (n, m, "encoder"), "decoder": (m, n, "decoder")}
  return {"decoder" if cfg.family == "decoder" else "encoder": (cfg.num_layers, 0, "single")}


def xavier(
    gain: float, distribution: str = "normal", names=ATTENTION_PROJECTIONS + FFN_PROJECTIONS
):
  """{projection: Init} for every projection in `names`."""
  return {n: Init(distribution, gain) for n in names}


def fourth_root(value: float) -> float:
  return math.pow(value, 0.25)
