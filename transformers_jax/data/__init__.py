"""Data for the four model families: text (LM / MLM), seq2seq pairs and images.

Everything is numpy, deterministic in (seed, step), and bundled: nothing is
downloaded. Bad input raises :class:`DataError` with a one-line fix.
"""

from transformers_jax.data.corpus import Corpus, build_corpus
from transformers_jax.data.errors import DataError
from transformers_jax.data.images import ImageBatches, digits_dataset, load_npz
from transformers_jax.data.packing import (
    classify_one_per_row,
    fit_examples,
    pack_pairs,
    pack_sequences,
    pairs_of_batch,
    seq2seq_one_per_row,
)
from transformers_jax.data.seq2seq import (
    NumberPairs,
    PairBatches,
    encode_pairs,
    load_tsv_pairs,
    read_tsv_rows,
    number_to_words,
)
from transformers_jax.data.text import LMBatches, mask_tokens, prepare_tokens, read_text_path
from transformers_jax.data.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    load_tokenizer,
    make_tokenizer,
    token_byte_lengths,
    train_bpe,
)

__all__ = [
    "classify_one_per_row",
    "fit_examples",
    "pack_pairs",
    "pack_sequences",
    "pairs_of_batch",
    "seq2seq_one_per_row",
    "BPETokenizer",
    "ByteTokenizer",
    "Corpus",
    "DataError",
    "ImageBatches",
    "LMBatches",
    "NumberPairs",
    "PairBatches",
    "Tokenizer",
    "build_corpus",
    "digits_dataset",
    "encode_pairs",
    "load_npz",
    "load_tokenizer",
    "load_tsv_pairs",
    "read_tsv_rows",
    "make_tokenizer",
    "mask_tokens",
    "number_to_words",
    "prepare_tokens",
    "read_text_path",
    "token_byte_lengths",
    "train_bpe",
]
