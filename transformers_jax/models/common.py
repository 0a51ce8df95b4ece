"""What the four families share besides the Block: input checks, default positions, heads.

Masks are built per token by transformers_jax.modules.masks.token_mask."""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.modules import parametrization
from transformers_jax.modules.common import dense, soft_cap
from transformers_jax.modules.placement_base import LOGIT_GAIN
from transformers_jax.modules.quantization import head_mode
from transformers_jax.modules.placements import PLACEMENTS
from transformers_jax.modules.placements.ngpt import LOGIT_SCALE, logit_scale, scaled_gain


def check_length(cfg, length: int, what: str = "sequence") -> None:
  """Refuse (at trace time, before any compute) a sequence longer than the position range."""
  if length > cfg.seq_len_max:
    raise ValueError(
        f"{what} length {length} exceeds model.max_len={cfg.seq_len_max}: "
        "shorten the input or raise model.max_len"
    )


def default_positions(batch: int, length: int):
  return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


def unembedding_input(cfg, x):
  """What the unembedding multiplies: the hidden states, or with model.unembed_scale (T5) the
  hidden states times d_model^-1/2."""
  return x * jnp.asarray(cfg.d_model**-0.5, x.dtype) if cfg.unembed_scale else x


def has_logit_gain(cfg) -> bool:
  """Whether the placement scales the vocabulary logits by a learned gain (nGPT's s_z)."""
  return LOGIT_GAIN in PLACEMENTS[cfg.norm_placement].features


class LogitGain(nn.Module):
  """logits [..., V padded] times a learned gain per vocabulary entry, `scale` (nGPT's s_z,
  stored in its init / scale form: modules/placements/ngpt.py)."""

  cfg: "ModelConfig"  # noqa: F821

  @nn.compact
  def __call__(self, logits):
    c = self.cfg
    s = scaled_gain(self, c, "scale", (c.padded_vocab,), LOGIT_SCALE, ("vocab",))
    return logits * s.astype(logits.dtype)


def lm_logits(cfg, embedder, x, name="lm_head", bias=None):
  """Tied (x E^T) or separate unembedding (+ `bias` [V padded]), in float32 for the loss, kept
  split over the batch (and the vocabulary over `tensor`), padded ids masked out; times the
  placement's logit gain where it has one."""
  x = unembedding_input(cfg, x)
  if cfg.tie_embeddings:
    logits = embedder.attend(x)
  else:
    names = ("embed", "vocab"), ("vocab",)
    head = dense(cfg, cfg.padded_vocab, -1, *names, name, False, quantized=head_mode(cfg))
    logits = head(x)
  if has_logit_gain(cfg):
    logits = LogitGain(cfg, name="logit_gain")(logits)
  return output_logits(cfg, logits, bias)


def unembedding(cfg, module, name="lm_head"):
  """The [D, V padded] matrix `lm_logits` multiplies the hidden states by, in the compute dtype
  (tied: the token table, transposed), read off `module`'s parameters: a loss over chunks of
  tokens (tasks/base.py, `loss_chunks`) makes each chunk's logits from it, so the logits of
  all tokens never exist at once."""
  params = nn.unbox(module.variables["params"])
  if cfg.tie_embeddings:
    matrix = params["embed"]["token_embed"]["embedding"].T
  else:
    matrix = params[name]["kernel"]
  if cfg.unembed_scale:  # as unembedding_input scales the hidden states
    matrix = matrix * cfg.d_model**-0.5
  if has_logit_gain(cfg):  # as LogitGain scales the logits
    matrix = matrix * logit_scale(cfg, params["logit_gain"]["scale"])
  return matrix.astype(jnp.dtype(cfg.dtype))


def readout(cfg, logits):
  """A readout's logits (vocabulary or classes) times the parametrisation's output multiplier
  (μP's base width / d_model; 1 under sp)."""
  multiplier = parametrization.of(cfg).output_multiplier(cfg)
  return logits if multiplier == 1.0 else logits * jnp.asarray(multiplier, logits.dtype)


def output_logits(cfg, logits, bias=None):
  """What every vocabulary head returns: float32 logits times the output multiplier (+ `bias`),
  kept split over the batch and the vocabulary over `tensor`, the rows that only pad the
  vocabulary masked out."""
  logits = readout(cfg, logits.astype(jnp.float32))
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  logits = soft_cap(logits, cfg.logit_softcap)  # Gemma 2's, before the padded ids are masked
  logits = nn.with_logical_constraint(logits, ("act_batch", "act_length", "act_vocab"))
  return mask_padded_vocab(cfg, logits)


# The logit of a padded vocabulary row: exp() of it is exactly 0 in float32, and it stays finite
# (unlike -inf) so sums over the vocabulary, as label smoothing takes, stay finite.
PADDED_LOGIT = -1e9


def mask_padded_vocab(cfg, logits):
  """logits [..., V padded] with PADDED_LOGIT added to the rows past vocab_size (real rows get
  + 0, which leaves them bit for bit). An added constant row, not a select: XLA:CPU fuses the
  add into the unembedding matmul, where a select costs a whole [..., V] temporary per step."""
  if cfg.padded_vocab == cfg.vocab_size:
    return logits
  real = jnp.arange(cfg.padded_vocab) < cfg.vocab_size
  return logits + jnp.where(real, 0.0, PADDED_LOGIT).astype(logits.dtype)
