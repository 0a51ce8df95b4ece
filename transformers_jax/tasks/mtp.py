"""Multi-token prediction (DeepSeek-V3, section 2.2 of its report): next-token prediction plus
the model's MTP modules (models/mtp.py, `model.mtp_depth` = D of them) predicting each token
k + 1 = 2 .. D + 1 places ahead, their cross-entropies weighted into the loss:

    L = L_main + (mtp.weight / D) sum_k L_MTP^k

(DeepSeek-V3: lambda = 0.3 for the first 10T tokens, then 0.1). Each L_MTP^k is summed over the
positions that have a token k + 1 places ahead within the same document and, as every loss
here, divided by the main objective's weight (the number of its targets), so that
micro-batches, devices and held-out batches add up; a depth's own mean is reported beside it
(mtp_nll_<k>). The data, batch layout and sampling are next-token prediction's (tasks/lm.py);
decoding never runs the MTP modules.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections

from transformers_jax.models.common import output_logits
from transformers_jax.models.mtp import future_tokens
from transformers_jax.tasks.base import chunked_cross_entropy, cross_entropy
from transformers_jax.tasks.lm import LanguageModeling


def depth_weights(weights, k: int):
  """Depth k's weights [B, T]: position i counts when the main objective's positions i .. i + k
  all do (the token k + 1 places ahead lies in the same document, within the row)."""
  T = weights.shape[1]
  out = weights
  for j in range(1, k + 1):
    out = out * future_tokens(weights, j, T)
  return out


class MultiTokenPrediction(LanguageModeling):
  name = "mtp"
  summary = "next-token prediction plus DeepSeek-V3's multi-token prediction (model.mtp_depth)"
  model_needs = {"mtp_depth": 1}

  def config_defaults(self):
    c = ml_collections.ConfigDict()
    c.weight = 0.3  # mtp: lambda, the MTP losses' weight (DeepSeek-V3: 0.3, then 0.1)
    return c

  def check(self, config, model_cfg) -> None:
    super().check(config, model_cfg)
    if model_cfg.mtp_depth < 1:
      raise ValueError(
          "model.mtp_depth=0: the mtp objective trains the model's multi-token prediction "
          "modules: set --config.model.mtp_depth=1 (DeepSeek-V3's) or use --config.task=lm"
      )
    if not config.mtp.weight >= 0:
      raise ValueError(f"mtp.weight={config.mtp.weight!r}: must be >= 0 (DeepSeek-V3: 0.3)")

  def loss_options(self, config):
    return dict(super().loss_options(config), mtp_weight=float(config.mtp.weight))

  def outputs(self, model, variables, batch, rngs, mutable):
    tokens = batch["tokens"]
    out, state = model.apply(
        variables,
        tokens[:, :-1],
        positions=batch.get("positions"),
        segment_ids=batch.get("segment_ids"),
        mtp_tokens=tokens,
        rngs=rngs,
        mutable=mutable,
    )
    weights = batch.get("weights", jnp.ones(tokens[:, 1:].shape, jnp.float32))
    main = (out["logits"], tokens[:, 1:], weights, (out["hidden"], out["unembedding"]))
    return (main, out["mtp_hidden"], out["unembedding"]), state

  def loss(self, outputs, batch, model_cfg, options, z_loss=0.0, train=True) -> dict:
    main, hidden, unembedding = outputs
    sums = super().loss(main, batch, model_cfg, options, z_loss, train)
    targets, weights = main[1], main[2]
    depth = hidden.shape[0]
    real = model_cfg.vocab_size if model_cfg.padded_vocab != model_cfg.vocab_size else None
    chunks = (options or {}).get("loss_chunks", 1) if train else 1
    for k in range(1, depth + 1):
      t, w = future_tokens(targets, k, targets.shape[1]), depth_weights(weights, k)
      if chunks > 1:
        part = chunked_cross_entropy(
            hidden[k - 1], unembedding, model_cfg, t, w, chunks, 0.0, real, 0.0
        )
      else:
        logits = output_logits(model_cfg, jnp.einsum("btd,dv->btv", hidden[k - 1], unembedding))
        part = cross_entropy(logits, t, w, num_classes=real)
      sums[f"mtp_nll_{k}"], sums[f"mtp_weight_{k}"] = part["nll"], part["weight"]
      if train:
        sums["loss"] = sums["loss"] + options["mtp_weight"] / depth * part["nll"]
    return sums

  def metrics(self, sums, weight) -> dict:
    out = super().metrics(sums, weight)
    for key in [k for k in sums if k.startswith("mtp_nll_")]:
      k = key.rpartition("_")[2]
      out[key] = sums[key] / jnp.maximum(sums[f"mtp_weight_{k}"], 1.0)
    return out

  def eval_summary(self, data, totals) -> dict:
    out = super().eval_summary(data, totals)
    for key in [k for k in totals if k.startswith("mtp_nll_")]:
      k = key.rpartition("_")[2]
      out[f"eval_{key}"] = float(totals[key]) / max(float(totals[f"mtp_weight_{k}"]), 1.0)
    return out
