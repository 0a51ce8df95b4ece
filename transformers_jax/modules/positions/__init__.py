"""Every position scheme, one entry each: `model.positions=NAME` picks it in all families.

Adding a scheme (a score bias among them): write a `PositionScheme` subclass (base.py says what
it may override) in a module of this package, and add it to POSITION_SCHEMES below. Everything
else (config validation, the four families, every attention path, scan and decoding, parameter
counts, --config_help and the docs' lists, the tests that run every scheme) reads this table.
"""

from __future__ import annotations

from transformers_jax.modules.positions.absolute import (
    Learned,
    NoPositions,
    Sinusoidal,
    SinusoidalHalves,
    sinusoidal_table,
)
from transformers_jax.modules.positions.alibi import ALiBi, alibi_slopes
from transformers_jax.modules.positions.base import (
    DecodeCounter,
    PositionScheme,
    ScoreBias,
    bias_param,
    index_positions,
)
from transformers_jax.modules.positions.relative_bias import RelativeBias, relative_bucket
from transformers_jax.modules.positions.rotary import (
    Rotary,
    apply_rope,
    linear_rope_factor,
    parse_rope_scaling,
    rope_angles,
    rope_frequencies,
)

POSITION_SCHEMES: dict[str, PositionScheme] = {
    "sinusoidal": Sinusoidal(),
    "sinusoidal_halves": SinusoidalHalves(),
    "learned": Learned(),
    "rope": Rotary(),
    "t5": RelativeBias(),
    "alibi": ALiBi(),
    "none": NoPositions(),
}


def position_scheme(c) -> PositionScheme:
  return POSITION_SCHEMES[c.positions]


__all__ = [
    "POSITION_SCHEMES",
    "DecodeCounter",
    "PositionScheme",
    "ScoreBias",
    "alibi_slopes",
    "apply_rope",
    "bias_param",
    "index_positions",
    "linear_rope_factor",
    "parse_rope_scaling",
    "position_scheme",
    "relative_bucket",
    "rope_angles",
    "rope_frequencies",
    "sinusoidal_table",
]
