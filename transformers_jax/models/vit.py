"""Vision Transformer: image -> patch tokens (+ class token) -> bidirectional Blocks -> head.

Heads (`model.head`): `classifier` (ViTForImageClassification: dense on the pooled token),
`pooler` (ViTModel: `pooled` is tanh(W h_pool), as in the encoder family), `none` (`pooled` is the
class token or the mean of the patch tokens, after the final norm).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

from transformers_jax.models.common import default_positions, readout
from transformers_jax.modules.block import Stack
from transformers_jax.modules.context import check_context, context_size
from transformers_jax.modules.common import dense, dtype_of, zeros
from transformers_jax.modules.embed import Embedder
from transformers_jax.modules.norms import Norm


def patchify(images, patch: int):
  """[B, H, W, C] -> [B, (H/p)(W/p), p*p*C], patches in row-major order, pixels (row, col, chan)."""
  B, H, W, C = images.shape
  x = images.reshape(B, H // patch, patch, W // patch, patch, C)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(B, (H // patch) * (W // patch), patch * patch * C)


class ViT(nn.Module):
  cfg: "ModelConfig"  # noqa: F821
  deterministic: bool = True
  decode: bool = False  # unused

  @nn.compact
  def __call__(self, images):
    """images [B, H, W, C] -> {'hidden', 'pooled', 'logits' [B, num_classes] if classifier}."""
    c = self.cfg
    expected = (c.image_size, c.image_size, c.num_channels)
    if tuple(images.shape[1:]) != expected:
      raise ValueError(
          f"images have shape {tuple(images.shape[1:])}, model expects {expected}: "
          "resize the images or set model.image_size / model.num_channels"
      )
    B = images.shape[0]
    x = dense(c, c.d_model, -1, ("patch", "embed"), ("embed",), "patch_embed")(
        patchify(images.astype(dtype_of(c.dtype)), c.patch_size)
    )
    if c.pool == "cls":
      cls = self.param(
          "cls_token", zeros((None, None, "embed")), (1, 1, c.d_model), dtype_of(c.param_dtype)
      )
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (B, 1, c.d_model)), x], axis=1)
    positions = default_positions(B, x.shape[1])
    check_context(x.shape[1], context_size(), "patch sequence (with the class token)")
    x = Embedder(c, self.deterministic, name="embed")(positions=positions, embedded=x)
    x = Stack(c, c.num_layers, deterministic=self.deterministic, name="encoder")(x, None, positions)
    if c.has_final_norm:
      x = Norm(c, name="final_norm")(x)
    pooled = x[:, 0] if c.pool == "cls" else jnp.mean(x, axis=1)
    if c.head_kind == "pooler":
      pooled = jnp.tanh(
          dense(c, c.d_model, -1, ("embed", "embed_out"), ("embed_out",), "pooler")(pooled)
      )
    out = {"hidden": x, "pooled": pooled}
    if c.head_kind == "classifier":
      classify = dense(c, c.num_classes, -1, ("embed", "classes"), ("classes",), "classifier")
      out["logits"] = readout(c, classify(pooled).astype(jnp.float32))
    return out
