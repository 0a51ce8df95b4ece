"""BERT (Devlin et al., 2019): encoder-only, learned positions + 2 token types, embedding LayerNorm,
post-LN, exact GELU, 30,522-token WordPiece vocabulary, 512 positions.

`base` (12 x 768, 12 heads) and `large` (24 x 1024, 16 heads) are `BertModel`: embeddings, encoder
and pooler — no MLM head and no classifier. Their published counts are those of the widely used
reference implementation (Hugging Face `BertModel`, bert-base-uncased / bert-large-uncased):
109,482,240 and 335,141,888. `roberta-base` and `roberta-large` are RoBERTa's (`RobertaModel`):
124,645,632 and 355,359,744. Set `--config.model.head=mlm` for `BertForMaskedLM` (no pooler; MLM
transform, norm and vocabulary bias; decoder tied to the word embedding) or `head=classifier`
with `num_classes` for `BertForSequenceClassification`.

`tiny` (2 x 64, byte vocabulary with [PAD]/[BOS]/[EOS]/[MASK], MLM head) is for tests and CPU runs.
`classify` is `tiny` with a 2-class classifier head on the bundled text classification task
(corpus windows: Python source 0, pydoc text 1); `--config.init_from` fine-tunes a `tiny` MLM run:

    python -m transformers_jax.train --config experiments/bert.py:tiny --workdir runs/bert-mlm
    python -m transformers_jax.train --config experiments/bert.py:classify \
        --workdir runs/bert-classify --config.init_from=runs/bert-mlm
"""

from transformers_jax.train_config import TINY_RUN, preset_config

BERT = dict(
    family="encoder",
    vocab_size=30522,
    max_len=512,
    type_vocab_size=2,
    positions="learned",
    norm_placement="post",
    norm="layernorm",
    norm_eps=1e-12,
    embed_norm=True,
    activation="gelu",
    tie_embeddings=True,
    use_bias=True,
    dropout=0.1,
    attention_dropout=0.1,
    head="pooler",
    vocab_multiple=128,
)  # 30,592 stored rows: the vocabulary splits over `tensor`
SOURCE = "Hugging Face BertModel (embeddings + encoder + pooler)"
# RoBERTa (Liu et al., 2019): BERT's model with a 50,265-token byte-level BPE vocabulary, one
# token type, LayerNorm eps 1e-5 and a position table of 514 rows whose first two are never read
# (position p reads row p + 2: model.position_offset=2)
ROBERTA = dict(
    vocab_size=50265,
    type_vocab_size=1,
    position_offset=2,
    norm_eps=1e-5,
    published_source="Hugging Face RobertaModel (roberta-base / roberta-large, with pooler)",
)

TINY = dict(
    num_layers=2,
    d_model=64,
    num_heads=4,
    vocab_size=260,
    max_len=128,
    dropout=0.0,
    attention_dropout=0.0,
    head="mlm",
    vocab_multiple=1,
)

PRESETS = {
    "tiny": TINY,
    # the tiny encoder with a 2-class head on its first token (text classification)
    "classify": dict(TINY, head="classifier", num_classes=2),
    "base": dict(num_layers=12, d_model=768, num_heads=12, published_params=109_482_240),
    "large": dict(num_layers=24, d_model=1024, num_heads=16, published_params=335_141_888),
    "roberta-base": dict(
        ROBERTA, num_layers=12, d_model=768, num_heads=12, published_params=124_645_632
    ),
    "roberta-large": dict(
        ROBERTA, num_layers=24, d_model=1024, num_heads=16, published_params=355_359_744
    ),
}

# Training fields per preset (the rest as in transformers_jax/train_config.py).
TRAINING = {
    "tiny": TINY_RUN,
    "classify": dict(TINY_RUN, learning_rate=1e-3),
}


def get_config(arg: str | None = None):
  return preset_config("bert.py", PRESETS, arg, BERT, SOURCE, TRAINING)
