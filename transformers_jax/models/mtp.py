"""DeepSeek-V3's multi-token prediction (MTP) modules (section 2.2 of its report), beside a
decoder's stack when `model.mtp_depth` > 0; the `mtp` Task (tasks/mtp.py) trains them.

Depth k = 1 .. D predicts, at position i, the token k + 1 places ahead, t_{i+k+1}. Its input
joins h_i^{k-1}, the previous depth's representation (k = 1: the main model's, the residual
stream after its last block), and the embedding of t_{i+k}:
    h'_i^k = M_k [RMSNorm(Emb(t_{i+k})) ; RMSNorm(h_i^{k-1})]      M_k [2D -> D]
    h^k    = TRM_k(h'^k)                                          one causal Block
and the model's own output head reads its final norm's output: P^k = Head(Norm(h^k)). The
embedding and the head are the main model's; M_k, the three norms and the block are the
module's (`mtp/depth_<k-1>/`: embed_norm, hidden_norm, proj, block, final_norm). The block is
the one the main stack would have as block L + k - 1 (an MoE block for DeepSeek-V3). Positions
past the row's end take token 0 and carry no target (the Task's weights say so), which keeps
every depth at the row's length.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.modules import remat
from transformers_jax.modules.block import Block
from transformers_jax.modules.common import dense
from transformers_jax.modules.norms import Norm
from transformers_jax.modules.positions import position_scheme


def future_tokens(tokens, k: int, length: int):
  """Tokens k places ahead of each of `length` positions of `tokens` [B, >= length] (0 past the
  row's end): what depth k embeds."""
  ahead = tokens[:, k : k + length]
  return jnp.pad(ahead, ((0, 0), (0, length - ahead.shape[1])))


class MultiTokenPrediction(nn.Module):
  """The D modules: (hidden [B, T, D] after the main stack, the future tokens' embeddings
  [D, B, T, D] ahead by 1 .. D, the stack's mask and positions) -> each depth's final-normed
  representation [D, B, T, D], which the model's head turns into logits."""

  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool = True

  @nn.compact
  def __call__(self, hidden, embeddings, mask, positions):
    c = self.cfg
    block = Block
    if c.remat != "none":
      block = nn.remat(Block, policy=remat.policy(c), prevent_cse=True)
    bias = position_scheme(c).score_bias(c, self, True)
    outs, h = [], hidden
    for k in range(c.mtp_depth):
      depth = _Depth(c, self.deterministic, block, c.num_layers + k, name=f"depth_{k}")
      h, normed = depth(h, embeddings[k], mask, positions, bias)
      outs.append(normed)
    return jnp.stack(outs)


class _Depth(nn.Module):
  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool
  block: type
  layer: int

  @nn.compact
  def __call__(self, hidden, embedded, mask, positions, bias):
    c = self.cfg
    joined = jnp.concatenate(
        [Norm(c, name="embed_norm")(embedded), Norm(c, name="hidden_norm")(hidden)], axis=-1
    )
    x = dense(c, c.d_model, -1, ("embed", "embed_out"), ("embed_out",), "proj", use_bias=False)(
        joined
    )
    block = self.block(
        c,
        causal=True,
        moe=c.is_moe_layer(self.layer),
        deterministic=self.deterministic,
        layer=self.layer,
        num_layers=c.num_layers,
        name="block",
    )
    h = block(x, mask, positions, None, None, bias)
    return h, Norm(c, name="final_norm")(h)
