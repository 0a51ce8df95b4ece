"""Vision Transformer (Dosovitskiy et al., 2021; Ti and S sizes from Touvron et al., 2021).

224 x 224 RGB images, 1,000 classes, class token, learned positions, pre-LN, exact GELU, final
LayerNorm, linear classifier on the class token.

| preset | patch | layers | d_model | d_ff | heads |
|--------|-------|--------|---------|------|-------|
| ti16   | 16    | 12     | 192     | 768  | 3     |
| s16    | 16    | 12     | 384     | 1536 | 6     |
| b16    | 16    | 12     | 768     | 3072 | 12    |
| l16    | 16    | 24     | 1024    | 4096 | 16    |
| h14    | 14    | 32     | 1280    | 5120 | 16    |
| 22b    | 14    | 48     | 6144    | 24576| 48    |

Counts include the patch embedding (with bias), class token, position table, blocks, final norm
and the 1,000-way classifier, and no pre-logits layer: the widely used reference
implementations (timm `vit_*_patch*_224`, Hugging Face `ViTForImageClassification` with 1,000
labels) have exactly these parameters. `tiny` classifies the bundled 8 x 8 digits (1 channel,
2 x 2 patches, 10 classes). `22b` is ViT-22B (Dehghani et al., 2023; see VIT_22B below): the
parallel block, query/key norms, RMSNorm and its bias pattern.
"""

from transformers_jax.train_config import preset_config

VIT = dict(
    family="vit",
    image_size=224,
    patch_size=16,
    num_channels=3,
    num_classes=1000,
    positions="learned",
    pool="cls",
    norm_placement="pre",
    norm="layernorm",
    norm_eps=1e-6,
    activation="gelu",
    use_bias=True,
    head="classifier",
)
SOURCE = "timm / Hugging Face ViTForImageClassification, 1,000 classes"
# ViT-22B (Dehghani et al., 2023): the parallel block (attention and MLP read one LayerNorm of
# the block's input and their sum is added to it), a norm on each head's queries and keys, no
# biases on the query/key/value projections (the MLP keeps its biases, and so does the output
# projection here) and every norm "without bias and centering" (Zhang & Sennrich's RMSNorm). Its figure of 21,743M is the paper's Table 1, which counts
# the blocks' weight matrices only (48 x (4 x 6,144^2 + 2 x 6,144 x 24,576) = 21,743,271,936);
# this preset's count adds the biases, norms, patch and position embeddings and a 1,000-way
# classifier (+0.06%). The paper's attention-pooling (MAP) head is not built here: the preset
# pools by the mean of the patch tokens.
SOURCE_22B = "Dehghani et al. 2023, Table 1 (21,743M: the blocks' weight matrices)"
VIT_22B = dict(
    num_layers=48,
    d_model=6144,
    num_heads=48,
    d_ff=24576,
    patch_size=14,
    norm_placement="parallel",
    norm="rmsnorm",
    qk_norm=True,
    qkv_bias=False,
    pool="mean",
    scan_layers=True,
)

PRESETS = {
    "tiny": dict(
        num_layers=2,
        d_model=64,
        num_heads=4,
        image_size=8,
        patch_size=2,
        num_channels=1,
        num_classes=10,
    ),
    "ti16": dict(num_layers=12, d_model=192, num_heads=3, published_params=5_717_416),
    "s16": dict(num_layers=12, d_model=384, num_heads=6, published_params=22_050_664),
    "b16": dict(num_layers=12, d_model=768, num_heads=12, published_params=86_567_656),
    "l16": dict(num_layers=24, d_model=1024, num_heads=16, published_params=304_326_632),
    "h14": dict(
        num_layers=32, d_model=1280, num_heads=16, patch_size=14, published_params=632_045_800
    ),
    "22b": dict(VIT_22B, published_params=21_743_000_000, published_source=SOURCE_22B),
}

# Training fields per preset (the rest as in transformers_jax/train_config.py).
TRAINING = {
    "tiny": dict(
        steps=300,
        batch_size=32,
        learning_rate=2e-3,
        warmup_steps=30,
        log_every=30,
        eval_every=150,
        checkpoint_every=150,
        eval_batches=12,
    ),
}


def get_config(arg: str | None = None):
  return preset_config("vit.py", PRESETS, arg, VIT, SOURCE, TRAINING)
