"""Every feed-forward non-linearity, one entry each: `model.activation=NAME` picks it, in the
dense FFN and in every MoE expert.

A gated entry (the GLU variants, Shazeer 2020) multiplies its function of one projection by a
second projection (`wi_0`, `wi_1`: the FFN has two input kernels, which the parameter counts read
off `gated`); the others apply it to the one projection (`wi`). Adding an activation is one
entry below (its function may live in a module of its own).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax


@dataclasses.dataclass(frozen=True)
class Activation:
  """`function`: the pointwise non-linearity (of the gate, when `gated`); `summary`: one line on
  what it is (--config_help, docs/config.md, docs/architecture.md)."""

  function: Callable
  summary: str
  gated: bool = False


GELU = functools.partial(jax.nn.gelu, approximate=False)
GELU_TANH = functools.partial(jax.nn.gelu, approximate=True)

ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(jax.nn.relu, "max(0, x) (the 2017 Transformer, T5)"),
    "gelu": Activation(GELU, "x Phi(x), the exact GELU (BERT, ViT)"),
    "gelu_tanh": Activation(GELU_TANH, "GELU's tanh approximation (GPT-2's gelu_new)"),
    "silu": Activation(jax.nn.silu, "x sigmoid(x), SiLU / swish (Marian)"),
    "swiglu": Activation(jax.nn.silu, "SiLU(x W0) * x W1, gated (LLaMA)", gated=True),
    "geglu": Activation(GELU, "GELU(x W0) * x W1, gated, exact GELU", gated=True),
    "geglu_tanh": Activation(
        GELU_TANH, "GELU_tanh(x W0) * x W1, gated (Gemma, T5 v1.1's gated-gelu)", gated=True
    ),
    # gpt-oss's experts: both halves clamped and (up + 1); modules/glu.py builds the callable
    "swiglu_clamped": Activation(
        jax.nn.silu,
        "gpt-oss's SwiGLU: clamped halves, (up + 1) * gate * sigmoid(alpha gate) (model.glu_alpha,"
        " glu_limit)",
        gated=True,
    ),
}


def activation(name: str) -> Callable:
  """The pointwise non-linearity of a non-gated FFN, or the gate's non-linearity when gated."""
  return ACTIVATIONS[name].function
