"""Every norm placement, one entry each: `model.norm_placement=NAME` picks it in all families.

Notation: x is the residual stream entering a sublayer, f the sublayer (attention or
feed-forward), N a norm of the config's kind (`model.norm`), l the block's 0-based index in its
stack of L blocks. For an encoder-decoder, N_enc and M_dec are the two stacks' depths.

Adding a placement: write a `Placement` subclass in one of this package's modules (its
`summary` and `sublayer` or `block`, plus any of `projection_init`, `token_embedding_std`,
`profile`, `features`, `final_norm`, `arg_*`, `paper_init`, `streams`, `constraint`,
`config_problem`) and add it to PLACEMENTS below. Everything else (config validation, the four
families, scan and remat, decoding, counting, --config_help and the docs' lists, the tests that
run every placement) reads this table.
"""

from __future__ import annotations

from transformers_jax.modules.placement_base import Placement
from transformers_jax.modules.placements.norm_sites import (
    B2T,
    HybridNorm,
    MixLN,
    NoNorm,
    NormFormer,
    Parallel,
    Peri,
    Post,
    Pre,
    Reordered,
    Sandwich,
    Scaled,
    SubLN,
    magneto_gain,
)
from transformers_jax.modules.placements.ngpt import NGPT
from transformers_jax.modules.placements.residual_scales import (
    SUBLAYER_ORDER,
    Admin,
    DeepNorm,
    LayerScale,
    ReZero,
    ReZeroSublayer,
    TFixup,
    cait_epsilon,
    deepnet_constants,
    tfixup_scale,
)
from transformers_jax.modules.placements.streams import (
    HyperConnections,
    ManifoldHyperConnections,
    sinkhorn,
)

PLACEMENTS: dict[str, Placement] = {
    "pre": Pre(),
    "post": Post(),
    "sandwich": Sandwich(),
    "peri": Peri(),
    "none": NoNorm(),
    "deepnorm": DeepNorm(),
    "admin": Admin(),
    "rezero": ReZero(),
    "rezero_sublayer": ReZeroSublayer(),
    "layerscale": LayerScale(),
    "tfixup": TFixup(),
    "reordered": Reordered(),
    "normformer": NormFormer(),
    "hybrid": HybridNorm(),
    "subln": SubLN(),
    "b2t": B2T(),
    "scaled": Scaled(),
    "parallel": Parallel(),
    "mixln": MixLN(),
    "ngpt": NGPT(),
    "hyper": HyperConnections(),
    "mhc": ManifoldHyperConnections(),
}

__all__ = [
    "PLACEMENTS",
    "SUBLAYER_ORDER",
    "cait_epsilon",
    "deepnet_constants",
    "magneto_gain",
    "sinkhorn",
    "tfixup_scale",
]
