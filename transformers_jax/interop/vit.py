"""ViT (ViTModel, ViTForImageClassification) <-> the vit family: pre-LN, class token, the
`pooler` (or `none` when a checkpoint has no pooler) or `classifier` head. The patch convolution
[D, C, P, P] becomes the `patch_embed` kernel over patches flattened in (row, col, channel)
order, as `patchify` lays them out; the [1, N, D] position table loses its batch axis."""

from __future__ import annotations

from transformers_jax.interop.common import (
    ENCODER_DEFAULTS,
    ENCODER_SUMMARY_KEYS,
    Family,
    Rule,
    UnsupportedArchitecture,
    dense,
    encoder_fields,
    encoder_hf_config,
    encoder_layer_rules,
    norm,
    require,
)


class ViT(Family):
  model_type = "vit"
  architectures = {"ViTModel": ("pooler", "none"), "ViTForImageClassification": ("classifier",)}
  base_prefix = {"ViTForImageClassification": "vit."}
  load_prefix = "vit."
  defaults = dict(
      ENCODER_DEFAULTS,
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
      image_size=224,
      patch_size=16,
      num_channels=3,
      qkv_bias=True,
  )
  summary_keys = (*ENCODER_SUMMARY_KEYS, *("image_size", "patch_size", "num_channels"))

  def fields(self, hf, architecture, where):
    require(hf, where, qkv_bias=True, pooler_act="tanh", pooler_output_size=hf["hidden_size"])
    sides = {}
    for key in ("image_size", "patch_size"):
      value = hf[key]
      if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
          raise UnsupportedArchitecture(
              f"{where}: {key}={value} is not square: only square images and patches are "
              "supported"
          )
        value = value[0]
      sides[key] = value
    fields = dict(
        encoder_fields(hf, where),
        family="vit",
        image_size=sides["image_size"],
        patch_size=sides["patch_size"],
        num_channels=hf["num_channels"],
        pool="cls",
        norm_placement="pre",
        head="pooler",
    )
    if architecture == "ViTForImageClassification":
      labels = hf.get("id2label")
      fields.update(
          head="classifier", num_classes=len(labels) if labels else hf.get("num_labels", 2)
      )
    return fields

  def hf_config(self, c, architecture):
    out = dict(
        encoder_hf_config(c),
        image_size=c.image_size,
        patch_size=c.patch_size,
        num_channels=c.num_channels,
        qkv_bias=True,
        pooler_act="tanh",
        pooler_output_size=c.d_model,
        encoder_stride=c.patch_size,
    )
    if c.head_kind == "classifier":
      out["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.num_classes)}
      out["label2id"] = {f"LABEL_{i}": i for i in range(c.num_classes)}
    return out

  def rules(self, c, base):
    e = base + "embeddings."
    rules = [
        Rule("copy", (e + "cls_token",), (("cls_token",),)),
        Rule("batch1", (e + "position_embeddings",), (("embed", "pos_embed", "embedding"),)),
        Rule(
            "patch",
            (e + "patch_embeddings.projection.weight",),
            (("patch_embed", "kernel"),),
            patch=(c.patch_size, c.num_channels),
        ),
        Rule("copy", (e + "patch_embeddings.projection.bias",), (("patch_embed", "bias"),)),
    ]
    rules += encoder_layer_rules(
        c, base, "attention.attention.", ("layernorm_before", "layernorm_after")
    )
    rules += norm(base + "layernorm", ("final_norm",))
    if c.head_kind == "pooler":
      rules += dense(base + "pooler.dense", ("pooler",))
    if c.head_kind == "classifier":
      rules += dense("classifier", ("classifier",))
    return rules

  def ignorable(self, c):
    return [r"embeddings\.position_ids"]

  def default_architecture(self, c):
    if c.family != "vit":
      return None
    return "ViTForImageClassification" if c.head_kind == "classifier" else "ViTModel"

  def requirements(self, c, architecture):
    return dict(
        family="vit",
        pool="cls",
        norm_placement="pre",
        has_final_norm=True,
        embed_norm=False,
        type_vocab_size=0,
    )

  def adjust_loaded(self, tensors, fields):
    if fields["head"] == "pooler" and "pooler.dense.weight" not in tensors:
      fields["head"] = "none"  # a ViTModel saved without its pooler
