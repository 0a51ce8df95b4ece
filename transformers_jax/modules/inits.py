"""Initialisations `model.init` picks, one entry each: what every weight matrix, embedding table
and block projection starts from (each entry's `summary`; docs/architecture.md lists them). A
norm placement's own rules (DeepNet's beta, T-Fixup's scales, Magneto's gamma:
`Placement.projection_init`) apply on top of any of them, since they are part of the scheme.
"""

from __future__ import annotations

import math

from transformers_jax.modules import parametrization
from transformers_jax.modules.placement_base import Depth, Init
from transformers_jax.modules.placements import PLACEMENTS

# the projections whose output is added to the residual stream (megatron scales them)
OUTPUT_PROJECTIONS = ("out", "wo")


class Initialisation:
  """Base class of a `model.init` entry: GPT-2's N(0, model.init_std) everywhere."""

  summary = "every weight N(0, model.init_std) (GPT-2, BERT: 0.02)"

  def default(self, cfg) -> Init:
    """A weight matrix's initialiser where nothing more specific applies."""
    return Init("std", cfg.init_std)

  def projections(self, cfg, depth: Depth, sublayer: str) -> dict[str, Init]:
    """Initialisers of one block sublayer's projections, by name (placement_base's
    ATTENTION_PROJECTIONS and FFN_PROJECTIONS); the rest take `default`."""
    del cfg, depth, sublayer
    return {}

  def embedding_std(self, cfg) -> float:
    """The standard deviation of the token, learned-position and token-type tables."""
    return cfg.init_std


class Xavier(Initialisation):
  """Every weight Xavier normal over its fan-in and fan-out (Glorot & Bengio 2010; the 2017
  Transformer and fairseq), embedding tables N(0, d_model^-1/2)."""

  summary = "Xavier normal weights, N(0, d_model^-1/2) embeddings (2017 Transformer, fairseq)"

  def default(self, cfg) -> Init:
    return Init("normal", 1.0)

  def embedding_std(self, cfg) -> float:
    return cfg.d_model**-0.5


class Megatron(Initialisation):
  """gpt2's, with the attention output and feed-forward output projections of a stack of L
  blocks at N(0, init_std / sqrt(2L)) (GPT-2's scaled residual init, Megatron-LM)."""

  summary = "gpt2's, with each block's output projections at init_std / sqrt(2 L) (Megatron-LM)"

  def projections(self, cfg, depth, sublayer):
    scaled = Init("std", cfg.init_std / math.sqrt(2 * depth.num_layers))
    return {name: scaled for name in OUTPUT_PROJECTIONS}


class Paper(Initialisation):
  """The placement's own: its entry's `paper_init`, one of the others (docs/norm_zoo.md lists
  them with their sources)."""

  summary = "the norm placement's own paper's (its registry entry's paper_init)"

  def of(self, cfg) -> Initialisation:
    return INITS[PLACEMENTS[cfg.norm_placement].paper_init]

  def default(self, cfg):
    return self.of(cfg).default(cfg)

  def projections(self, cfg, depth, sublayer):
    return self.of(cfg).projections(cfg, depth, sublayer)

  def embedding_std(self, cfg):
    return self.of(cfg).embedding_std(cfg)


INITS: dict[str, Initialisation] = {
    "gpt2": Initialisation(),
    "xavier": Xavier(),
    "megatron": Megatron(),
    "paper": Paper(),
}


def projection_rules(cfg, depth: Depth, sublayer: str) -> dict[str, Init]:
  """A block sublayer's projection initialisers: the initialisation's, then the placement's."""
  placement = PLACEMENTS[cfg.norm_placement]
  return {
      **INITS[cfg.init].projections(cfg, depth, sublayer),
      **placement.projection_init(cfg, depth, sublayer),
  }


def default_rule(cfg) -> Init:
  return INITS[cfg.init].default(cfg)


def token_embedding_std(cfg) -> float:
  """The token table's standard deviation: the placement's (T-Fixup's) or the
  initialisation's, at the base width under a width-scaled parametrisation."""

  def std_of(c):
    return PLACEMENTS[c.norm_placement].token_embedding_std(c) or INITS[c.init].embedding_std(c)

  return parametrization.embedding_std(cfg, std_of)


def embedding_std(cfg) -> float:
  return parametrization.embedding_std(cfg, lambda c: INITS[c.init].embedding_std(c))


def config_problem(cfg) -> tuple[str, str, str] | None:
  if cfg.init not in INITS:
    return "init", repr(cfg.init), f"choose one of {', '.join(INITS)}"
  if PLACEMENTS[cfg.norm_placement].paper_init not in INITS:  # a registry entry's own mistake
    return "norm_placement", repr(cfg.norm_placement), "its paper_init names no initialisation"
  return None
