"""Parametrisations `model.parametrization` picks, one entry each: how initial scales, forward
multipliers and per-tensor Adam learning rates change as a model grows wider (and deeper) than
the base shape its hyperparameters were tuned at, so that the base's best learning rate stays
best (docs/mup.md).

Every tensor has a role, read off its logical axis names (leading stack axes dropped: the scan
axis `layers`, the experts of expert weights; and unnamed axes of size 1, which broadcast): an axis
is *wide* when its size grows with d_model (WIDE_AXES), fixed otherwise.

  vector  no wide axis, or one axis in all: biases (the experts' too), norm scales, gains,
          the class token
  input   fixed axes then wide ones: token, position and type tables, ViT's patch projection,
          multi-head latent attention's up-projections (the latent's rank is read as fixed: a
          sweep that widens it with d_model is outside these rules)
  hidden  every axis wide: attention, feed-forward, expert and pooler matrices
  output  wide axes then fixed ones: the unembedding and classifiers (READOUT_AXES, which take
          the output multiplier), routers (the rest, which take Table 3's own output rule)

With m = d_model / model.mup_base_width (1 at the base width, where every entry equals `sp`),
μP for Adam (Yang et al. 2021, Tensor Programs V, Table 3; the readout in its multiplier form,
as the `mup` package writes it):

  hidden  initial std / sqrt(m) (an initialisation whose std is fixed; Xavier's already scales
          so), Adam rate / m
  output  readouts: logits times 1 / m, initial std and rate as at the base; routers (and
          latent attention's down-projections): initial std / m and rate / m (variance
          1 / fan_in^2, rate 1 / fan_in)
  input, vector   as at the base (an initialisation whose embedding std shrinks with d_model
          keeps the base width's)
  Xavier's variance, 2 / (fan_in + fan_out), is read at the base width's fans wherever one fan
  is fixed and the other wide (input, readout, output), so that "as at the base" holds for it
  too (placement_base.Init's fan_divisors).
  attention       q.k scaled by sqrt(K_b) / K rather than 1 / sqrt(K), K_b the head width at
          the base width: 1/d attention, equal to the usual at the base

CompleteP (Dey et al. 2025, depth-μP with alpha = 1) adds, with l = L / model.mup_base_depth
for a stack of L blocks: each residual branch times 1 / l; Adam's epsilon times 1 / (m l) on
hidden tensors and 1 / l on vectors; AdamW's decay of hidden tensors times m (so that rate x
decay stays as at the base). Its rates for alpha = 1 are μP's.
"""

from __future__ import annotations

import functools
import math

from transformers_jax.modules.placement_base import Init

# Logical axes whose size grows with d_model (the residual stream, heads and their widths, the
# feed-forward's hidden units, the pooler's output); every other axis is fixed.
WIDE_AXES = frozenset({"embed", "embed_out", "heads", "kv_heads", "head_dim", "mlp"})
# Axes dropped before a tensor's role is read: they stack tensors, they are not fans.
STACK_AXES = frozenset({"layers", "experts", "expert"})
# A readout's fixed output axes: the logits these produce take the output multiplier.
READOUT_AXES = frozenset({"vocab", "classes"})
ROLES = ("vector", "input", "hidden", "output", "readout")


def role_of(names, leaf: str = "kernel", shape=None) -> str:
  """A tensor's role (module docstring) from its logical axis names (None: an unnamed axis), its
  parameter's name (`leaf`: a bias is a vector whatever its shape) and, where known, its shape
  (an unnamed axis of size 1 broadcasts, as in the experts' biases [E, 1, width]: not a fan)."""
  axes = list(names)
  if shape is not None:
    axes = [n for n, size in zip(axes, shape, strict=True) if n is not None or size != 1]
  while axes and axes[0] in STACK_AXES:  # leading stack axes (a router's experts are its output)
    axes = axes[1:]
  wide = [n in WIDE_AXES for n in axes]
  if leaf.endswith("bias") or len(axes) < 2 or not any(wide):
    return "vector"
  if all(wide):
    return "hidden"
  first_fixed = wide.index(False)
  if any(wide[first_fixed:]):  # a fixed axis before a wide one: the tensor reads fixed inputs
    return "input"
  return "readout" if set(axes[first_fixed:]) & READOUT_AXES else "output"


class Standard:
  """Standard parametrisation: every tensor as model.init and the placement set it, one
  learning rate for all (today's behaviour)."""

  summary = "standard: every tensor as model.init sets it, one Adam rate for all (default)"
  reads_base_width = False
  reads_base_depth = False

  def width_ratio(self, cfg) -> float:
    """m: d_model over the base width (1 without one)."""
    del cfg
    return 1.0

  def depth_ratio(self, cfg, num_layers: int) -> float:
    """l: a stack's depth over the base depth (1 without one)."""
    del cfg, num_layers
    return 1.0

  def init(self, cfg, role: str, rule: Init) -> Init:
    """The initialiser of a projection of `role` whose base rule is `rule`."""
    del cfg, role
    return rule

  def output_multiplier(self, cfg) -> float:
    del cfg
    return 1.0

  def query_multiplier(self, cfg) -> float:
    """What the queries are multiplied by on top of the usual q.k / sqrt(K)."""
    del cfg
    return 1.0

  def branch_multiplier(self, cfg, num_layers: int) -> float:
    """What each residual branch of a stack of `num_layers` blocks is multiplied by."""
    del cfg, num_layers
    return 1.0

  def optimizer_scales(self, cfg, role: str) -> tuple[float, float, float]:
    """(rate, epsilon, weight decay) multipliers of Adam for a tensor of `role`."""
    del cfg, role
    return 1.0, 1.0, 1.0

  def config_problem(self, cfg) -> tuple[str, str, str] | None:
    if cfg.mup_base_width and not self.reads_base_width:
      return "mup_base_width", str(cfg.mup_base_width), "only mup and complete_p read it: set 0"
    if cfg.mup_base_depth and not self.reads_base_depth:
      return "mup_base_depth", str(cfg.mup_base_depth), "only complete_p reads it: set 0"
    return None


class MuP(Standard):
  """μP for Adam (Yang et al. 2021, Tensor Programs V, Table 3): hidden tensors' initial std
  / sqrt(m) and Adam rate / m, the readout's logits / m, 1/d attention; m = d_model /
  model.mup_base_width."""

  summary = "μP (Yang et al. 2021, Table 3 for Adam): hidden init/sqrt(m), rate/m; logits/m; 1/d"
  reads_base_width = True

  def width_ratio(self, cfg):
    return cfg.d_model / cfg.mup_base_width

  def init(self, cfg, role, rule):
    m = self.width_ratio(cfg)
    xavier = rule.distribution != "std"
    if role == "hidden":  # Xavier's fans (both wide) already scale its variance by 1/m
      return rule if xavier else Init("std", rule.gain / math.sqrt(m))
    if role in ("readout", "output"):  # the base's variance (readout), / m^2 (output)
      gain = rule.gain / m if role == "output" else rule.gain
      return Init(rule.distribution, gain, (m, 1.0) if xavier else rule.fan_divisors)
    if role == "input" and xavier:  # the base's variance: fan-out read at the base width
      return Init(rule.distribution, rule.gain, (1.0, m))
    return rule

  def output_multiplier(self, cfg):
    return 1.0 / self.width_ratio(cfg)

  def query_multiplier(self, cfg):
    # sqrt(K) * sqrt(K_b) / K, K_b the head width at the base width (heads fixed: K / m)
    base_head = cfg.head_dim if cfg.head_dim is not None else cfg.mup_base_width / cfg.num_heads
    return math.sqrt(base_head / cfg.head_width)

  def optimizer_scales(self, cfg, role):
    rate = 1.0 / self.width_ratio(cfg) if role in ("hidden", "output") else 1.0
    return rate, 1.0, 1.0

  def config_problem(self, cfg):
    if not cfg.mup_base_width:
      return (
          "mup_base_width",
          "0",
          f"{cfg.parametrization} scales from a base width: set it to the d_model the learning "
          "rate was tuned at (e.g. 64)",
      )
    if cfg.mup_base_width > cfg.d_model:
      return (
          "mup_base_width",
          str(cfg.mup_base_width),
          f"larger than model.d_model={cfg.d_model}: the base is the small model the rates "
          "were tuned at; set it <= d_model",
      )
    return super().config_problem(cfg)


class CompleteP(MuP):
  """CompleteP (Dey et al. 2025; depth-μP with alpha = 1): μP, each residual branch times
  1 / l, Adam's epsilon / (m l) on hidden tensors and / l on vectors, hidden weight decay
  times m; l = a stack's depth / model.mup_base_depth."""

  summary = "CompleteP (Dey et al. 2025): μP plus residual branches x L_base/L, depth-scaled eps"
  reads_base_depth = True

  def depth_ratio(self, cfg, num_layers):
    return num_layers / cfg.mup_base_depth

  def branch_multiplier(self, cfg, num_layers):
    return 1.0 / self.depth_ratio(cfg, num_layers)

  def optimizer_scales(self, cfg, role):
    rate, _, _ = super().optimizer_scales(cfg, role)
    m, deeper = self.width_ratio(cfg), self.depth_ratio(cfg, stack_depths(cfg)[0])
    if role == "hidden":
      return rate, 1.0 / (m * deeper), m
    if role == "vector":
      return rate, 1.0 / deeper, 1.0
    return rate, 1.0, 1.0

  def config_problem(self, cfg):
    problem = super().config_problem(cfg)
    if problem:
      return problem
    base = cfg.mup_base_depth
    if not base:
      fix = "complete_p scales from a base depth: set it to the blocks the rate was tuned at"
      return "mup_base_depth", "0", fix
    depths = stack_depths(cfg)
    if len(set(depths)) > 1:
      fix = "complete_p needs one depth for both stacks: set num_encoder/decoder_layers equal"
      return "mup_base_depth", str(base), fix
    if depths[0] < base or depths[0] % base:
      fix = (
          f"the model's {depths[0]} blocks per stack are not a whole multiple of it: "
          "complete_p scales the base depth by whole factors; set num_layers to a multiple "
          "or mup_base_depth to a divisor"
      )
      return "mup_base_depth", str(base), fix
    return None


def stack_depths(cfg) -> tuple[int, ...]:
  """The blocks of each of the model's stacks."""
  if cfg.family == "encoder_decoder":
    return (cfg.encoder_layers, cfg.decoder_layers)
  return (cfg.num_layers,)


PARAMETRIZATIONS: dict[str, Standard] = {
    "sp": Standard(),
    "mup": MuP(),
    "complete_p": CompleteP(),
}


def of(cfg) -> Standard:
  return PARAMETRIZATIONS[cfg.parametrization]


def describe(cfg) -> str:
  """The parametrisation in force, for a run's first line."""
  if cfg.parametrization == "sp":
    return "parametrization sp"
  text = f"parametrization {cfg.parametrization} (base width {cfg.mup_base_width}"
  if of(cfg).reads_base_depth:
    text += f", base depth {cfg.mup_base_depth}"
  return text + f"; width x{of(cfg).width_ratio(cfg):g})"


def kernel_rule(cfg, names, rule: Init) -> Init:
  """A projection's initialiser under the parametrisation: `rule` (the initialisation's or the
  placement's) rescaled for the tensor's role."""
  return of(cfg).init(cfg, role_of(names), rule)


def embedding_std(cfg, std_of) -> float:
  """An embedding table's std: `std_of(cfg)`, or under a width-scaled parametrisation the
  base width's (input weights keep their base scale)."""
  if not of(cfg).reads_base_width:
    return std_of(cfg)
  return std_of(_AtWidth(cfg, cfg.mup_base_width))


class _AtWidth:
  """`cfg` read as if its d_model were `width` (what an initialisation's embedding std reads)."""

  def __init__(self, cfg, width: int):
    self._cfg, self.d_model = cfg, width

  def __getattr__(self, name):
    return getattr(self._cfg, name)


@functools.lru_cache(maxsize=64)
def optimizer_groups(cfg, leaves: tuple) -> dict[str, tuple[float, float, float]]:
  """{parameter path: (rate, epsilon, decay) multipliers} for `leaves`, a tuple of (path,
  parameter name, logical names, shape) of the model's parameters."""
  entry = of(cfg)
  return {
      path: entry.optimizer_scales(cfg, role_of(names, leaf, shape))
      for path, leaf, names, shape in leaves
  }


def config_problem(cfg) -> tuple[str, str, str] | None:
  if cfg.parametrization not in PARAMETRIZATIONS:
    fix = f"choose one of {', '.join(PARAMETRIZATIONS)}"
    return "parametrization", repr(cfg.parametrization), fix
  return of(cfg).config_problem(cfg)
