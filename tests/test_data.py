"""Property tests for transformers_jax.data (numpy only, no downloads)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformers_jax.data import (
    ByteTokenizer,
    DataError,
    ImageBatches,
    LMBatches,
    NumberPairs,
    PairBatches,
    build_corpus,
    digits_dataset,
    load_npz,
    load_tokenizer,
    load_tsv_pairs,
    make_tokenizer,
    mask_tokens,
    number_to_words,
    prepare_tokens,
    read_text_path,
    train_bpe,
)
from transformers_jax.data.corpus import is_validation_name

SMALL = 300_000


@pytest.fixture(scope="module")
def corpus():
  return build_corpus(SMALL)


@pytest.fixture(scope="module")
def bpe(corpus):
  return train_bpe([t for _, t in corpus.train_docs], 512)


# --- corpus -------------------------------------------------------------------------------------


def test_corpus_is_deterministic_and_split_by_document():
  a, b = build_corpus.__wrapped__(), build_corpus.__wrapped__()
  assert a == b and a.text("train") == b.text("train")
  train, val = {n for n, _ in a.train_docs}, {n for n, _ in a.val_docs}
  assert not train & val
  assert all(is_validation_name(n, 0.05) for n in val) and not any(
      is_validation_name(n, 0.05) for n in train
  )
  assert any(n.startswith("pydoc/") for n in train) and any(n.startswith("stdlib/") for n in train)
  assert not any(
      p in {"test", "tests", "site-packages", "idle_test"}
      for n in train | val
      for p in n.split("/")
  )
  names = [n for n, _ in a.train_docs]
  assert names == sorted(names)
  stats = a.stats()
  assert stats["train_bytes"] >= 4_000_000 and stats["validation_bytes"] > 20_000
  assert stats["train_files"] > 100 and stats["validation_files"] >= 3


def test_corpus_cap_and_errors(corpus):
  sizes = [len(t.encode()) for _, t in corpus.train_docs]
  assert SMALL <= sum(sizes) < SMALL + sizes[-1]
  assert corpus.text("validation").count("\n\n") >= len(corpus.val_docs) - 1
  with pytest.raises(DataError, match="unknown corpus split"):
    corpus.text("test")
  with pytest.raises(DataError):
    build_corpus(0)


# --- tokenizers ---------------------------------------------------------------------------------

TEXT = "Grüße, 世界! naïve café — emoji 🙂 and tabs\tand\nnewlines"


def test_byte_tokenizer_round_trip_and_specials(tmp_path):
  plain, special = ByteTokenizer(), ByteTokenizer(specials=True)
  assert plain.vocab_size == 256 and plain.eos_id is None and plain.special_ids == []
  ids = plain.encode(TEXT)
  assert ids == list(TEXT.encode("utf-8")) and plain.decode(ids) == TEXT
  assert special.vocab_size == 260 and special.special_ids == [256, 257, 258, 259]
  assert (special.cls_id, special.sep_id) == (special.bos_id, special.eos_id)
  assert special.decode([257, *ids, 258, 256]) == TEXT
  assert special.decode([0xFF, 65]) == "\ufffdA"
  special.save(tmp_path / "tok.json")
  loaded = load_tokenizer(tmp_path / "tok.json")
  assert isinstance(loaded, ByteTokenizer) and loaded.vocab_size == 260


def test_bpe_vocab_round_trip_and_save_load(bpe, tmp_path):
  assert 260 <= bpe.vocab_size <= 512
  assert len(set(bpe.special_ids)) == 4 and max(bpe.special_ids) < bpe.vocab_size
  ids = bpe.encode(TEXT)
  assert max(ids) < bpe.vocab_size and bpe.decode(ids) == TEXT
  assert len(bpe.encode("def __init__(self):\n    return None")) < len(
      "def __init__(self):\n    return None"
  )
  bpe.save(tmp_path / "bpe.json")
  loaded = load_tokenizer(tmp_path / "bpe.json")
  assert loaded.vocab_size == bpe.vocab_size and loaded.encode(TEXT) == ids
  tiny = train_bpe(["ab ab ab"], 1000)
  assert tiny.vocab_size <= 1000 and tiny.decode(tiny.encode(TEXT)) == TEXT


def test_make_tokenizer_errors():
  assert make_tokenizer("byte", 260, specials=True).vocab_size == 260
  with pytest.raises(DataError, match="unknown tokenizer kind"):
    make_tokenizer("wordpiece", 1000)
  with pytest.raises(DataError, match="at least 260"):
    make_tokenizer("byte", 256, specials=True)
  with pytest.raises(DataError, match="training text"):
    make_tokenizer("bpe", 1000)
  with pytest.raises(DataError, match="below"):
    train_bpe(["abc"], 100)


# --- token files ----------------------------------------------------------------------------------


class CountingByteTokenizer(ByteTokenizer):
  calls = 0

  def encode(self, text):
    CountingByteTokenizer.calls += 1
    return super().encode(text)


def test_prepare_tokens_writes_and_reuses(tmp_path):
  tok, out = CountingByteTokenizer(specials=True), tmp_path / "sub" / "train.bin"
  docs = ["héllo", "world"]
  arr = prepare_tokens(docs, tok, out, 260)
  assert arr.dtype == np.uint16 and list(arr) == [*"héllo".encode(), 258, *b"world", 258]
  meta = json.loads((tmp_path / "sub" / "train.bin.json").read_text())
  assert meta["length"] == len(arr) and meta["tokenizer"] == "byte" and meta["vocab_size"] == 260
  calls = CountingByteTokenizer.calls
  assert (
      list(prepare_tokens(docs, tok, out, 260)) == list(arr)
      and CountingByteTokenizer.calls == calls
  )
  assert list(prepare_tokens(["other"], tok, out, 260)) == [
      *b"other",
      258,
  ]  # changed text: rewritten
  plain = prepare_tokens(docs, ByteTokenizer(), tmp_path / "plain.bin", 70_000)
  assert plain.dtype == np.uint32 and bytes(plain.astype(np.uint8)) == "héllo\n\nworld".encode()


def test_prepare_tokens_rejects_out_of_range_and_empty(tmp_path):
  with pytest.raises(DataError, match=r"token id 258 is outside \[0, vocab_size=256\)"):
    prepare_tokens(["abc"], ByteTokenizer(specials=True), tmp_path / "x.bin", 256)
  with pytest.raises(DataError, match="empty"):
    prepare_tokens(["  "], ByteTokenizer(specials=True), tmp_path / "x.bin", 260)
  with pytest.raises(DataError, match="empty"):
    prepare_tokens([], ByteTokenizer(), tmp_path / "x.bin", 256)
  assert list(tmp_path.iterdir()) == []


def test_read_text_path(tmp_path):
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "z.txt").write_text("zed", encoding="utf-8")
  (tmp_path / "a.txt").write_text("ay", encoding="utf-8")
  (tmp_path / "skip.md").write_text("no", encoding="utf-8")
  assert read_text_path(tmp_path) == [("a.txt", "ay"), ("b/z.txt", "zed")]
  assert read_text_path(tmp_path / "a.txt") == [("a.txt", "ay")]
  with pytest.raises(DataError, match="does not exist"):
    read_text_path(tmp_path / "nope.txt")
  (tmp_path / "empty").mkdir()
  with pytest.raises(DataError, match=r"no \.txt files"):
    read_text_path(tmp_path / "empty")
  (tmp_path / "e").mkdir()
  (tmp_path / "e" / "blank.txt").write_text(" \n", encoding="utf-8")
  with pytest.raises(DataError, match="only empty text"):
    read_text_path(tmp_path / "e")


# --- LM batches and masking -------------------------------------------------------------------------


def test_lm_batches_depend_only_on_seed_and_step():
  data = LMBatches(np.arange(5000, dtype=np.uint16))
  a = data.batch(3, 8, 32, seed=1)
  assert a.shape == (8, 33) and a.dtype == np.int32
  assert np.array_equal(a, data.batch(3, 8, 32, seed=1))
  assert not np.array_equal(a, data.batch(4, 8, 32, seed=1))
  assert not np.array_equal(a, data.batch(3, 8, 32, seed=2))
  inputs, targets = a[:, :-1], a[:, 1:]
  assert np.array_equal(
      targets, inputs + 1
  )  # contiguous windows: targets are inputs shifted by one
  with pytest.raises(DataError, match="has 10 tokens but seq_len 10 needs at least 11"):
    LMBatches(np.arange(10)).batch(0, 2, 10, 0)


def test_lm_eval_batches_are_sequential():
  data = LMBatches(np.arange(1000))
  batches = data.eval_batches(4, 10, num_batches=100)
  assert len(batches) == 999 // 10 // 4
  assert np.array_equal(batches[0][0], np.arange(11)) and np.array_equal(
      batches[1][0], np.arange(40, 51)
  )
  assert all(
      np.array_equal(x, y) for x, y in zip(batches, data.eval_batches(4, 10, 100), strict=True)
  )
  assert len(data.eval_batches(4, 10, num_batches=2)) == 2


def test_mask_tokens_bert_proportions():
  rng = np.random.default_rng(0)
  specials = [256, 257, 258, 259]
  tokens = rng.integers(0, 260, size=(400, 512))
  inputs, labels, weights = mask_tokens(tokens, np.random.default_rng(1), 260, 259, specials)
  special = np.isin(tokens, specials)
  picked = weights > 0
  assert np.array_equal(labels, tokens) and inputs.dtype == np.int32
  assert not picked[special].any() and np.array_equal(inputs[special], tokens[special])
  assert np.array_equal(inputs[~picked], tokens[~picked])
  assert abs(picked[~special].mean() - 0.15) < 0.005
  masked = inputs[picked] == 259
  kept = inputs[picked] == tokens[picked]
  replaced = ~masked & ~kept
  assert (
      abs(masked.mean() - 0.8) < 0.01
      and abs(kept.mean() - 0.1) < 0.01
      and abs(replaced.mean() - 0.1) < 0.01
  )
  assert not np.isin(inputs[picked & (inputs != 259)], specials).any()
  again = mask_tokens(tokens, np.random.default_rng(1), 260, 259, specials)
  assert all(np.array_equal(x, y) for x, y in zip((inputs, labels, weights), again, strict=True))


# --- seq2seq -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, words",
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (40, "forty"),
        (105, "one hundred five"),
        (1000, "one thousand"),
        (4213, "four thousand two hundred thirteen"),
        (1000001, "one million one"),
        (
            999999999,
            "nine hundred ninety-nine million nine hundred ninety-nine thousand nine hundred ninety-nine",
        ),
    ],
)
def test_number_to_words(n, words):
  assert number_to_words(n) == words


def test_number_to_words_range():
  with pytest.raises(DataError):
    number_to_words(1_000_000_000)


def test_number_pairs_batches():
  tok, task = ByteTokenizer(specials=True), NumberPairs()
  b = task.batch(5, 16, 12, 100, seed=0, tokenizer=tok)
  assert all(np.array_equal(v, task.batch(5, 16, 12, 100, 0, tok)[k]) for k, v in b.items())
  assert not np.array_equal(b["src"], task.batch(6, 16, 12, 100, 0, tok)["src"])
  assert {k: v.shape for k, v in b.items()} == {
      "src": (16, 12),
      "tgt_in": (16, 100),
      "tgt_out": (16, 100),
      "src_mask": (16, 12),
      "tgt_mask": (16, 100),
  }
  assert all(v.dtype == np.int32 for v in b.values())
  assert np.array_equal(b["src"] == tok.pad_id, b["src_mask"] == 0)
  assert np.array_equal(b["tgt_out"] == tok.pad_id, b["tgt_mask"] == 0)
  assert (b["tgt_in"][:, 0] == tok.bos_id).all()
  assert np.array_equal(
      b["tgt_in"][:, 1:] * b["tgt_mask"][:, 1:], b["tgt_out"][:, :-1] * b["tgt_mask"][:, 1:]
  )
  last = b["tgt_mask"].sum(1) - 1
  assert (b["tgt_out"][np.arange(16), last] == tok.eos_id).all()
  for src, tgt in zip(b["src"], b["tgt_out"], strict=True):
    assert tok.decode(tgt) == number_to_words(int(tok.decode(src)))
  reverse = NumberPairs("words_to_digits").batch(0, 4, 100, 12, 0, tok)
  assert tok.decode(reverse["tgt_out"][0]).isdigit()
  with pytest.raises(DataError, match="src_len=3"):
    task.batch(0, 64, 3, 100, 0, tok)
  with pytest.raises(DataError, match="pad/bos/eos"):
    task.batch(0, 4, 12, 100, 0, ByteTokenizer())


def test_number_pairs_train_and_validation_disjoint():
  task = NumberPairs(max_value=9999)
  train = np.concatenate([task.sample_numbers(s, 256, seed=3) for s in range(40)])
  assert not task.is_validation(train).any()
  assert len(np.unique(np.char.str_len(train.astype(str)))) == 4  # all digit lengths occur
  val = {int(s) for s, _ in task.validation_pairs(200)}
  assert len(val) == 200 and task.is_validation(np.array(sorted(val))).all()
  assert not val & set(train.tolist())
  assert task.validation_pairs(200) == NumberPairs(max_value=9999).validation_pairs(200)


def test_tsv_pairs(tmp_path):
  good = tmp_path / "pairs.tsv"
  good.write_text("hi\tsalut\n\ncat\tchat with spaces\n", encoding="utf-8")
  assert load_tsv_pairs(good) == [("hi", "salut"), ("cat", "chat with spaces")]
  with pytest.raises(DataError, match="does not exist"):
    load_tsv_pairs(tmp_path / "missing.tsv")
  bad = tmp_path / "bad.tsv"
  bad.write_text("a\tb\nno tab here\n", encoding="utf-8")
  with pytest.raises(DataError, match=r"line 2 .* has no tab"):
    load_tsv_pairs(bad)
  blank = tmp_path / "blank.tsv"
  blank.write_text("\n\n", encoding="utf-8")
  with pytest.raises(DataError, match="no pairs"):
    load_tsv_pairs(blank)
  # the seq2seq task's errors name the file's line
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.tasks import TASKS

  config = load_config_module("experiments/transformer.py").get_config("tiny")
  long = tmp_path / "long.tsv"
  long.write_text("a\tb\n\na long source\tc\n", encoding="utf-8")
  config.data.path, config.seq_len = str(long), 4
  with pytest.raises(DataError, match=r"line 3 needs 13 source .* src_len=4"):
    TASKS["seq2seq"].data(config, ModelConfig.from_dict(config.model), tmp_path)


def test_pair_batches_deterministic_and_eval_weights():
  tok = ByteTokenizer(specials=True)
  pairs = [(str(i), number_to_words(i)) for i in range(10)]
  data = PairBatches(pairs, tok, 4, 12)
  assert np.array_equal(data.batch(2, 5, 0)["src"], data.batch(2, 5, 0)["src"])
  epoch = np.concatenate([data.batch(s, 5, 7)["src"][:, 0] for s in range(2)])
  assert sorted(epoch.tolist()) == [
      ord(str(i)) for i in range(10)
  ]  # one epoch sees every pair once
  evals = data.eval_batches(4)
  assert [b["weights"].tolist() for b in evals][-1] == [1, 1, 0, 0]
  assert tok.decode(np.concatenate([b["src"][b["weights"] > 0, 0] for b in evals])) == "0123456789"


# --- images ------------------------------------------------------------------------------------------


def test_digits_split():
  (xt, yt), (xv, yv) = digits_dataset("train"), digits_dataset("validation")
  assert xt.shape == (1438, 8, 8, 1) and xv.shape == (359, 8, 8, 1) and xt.dtype == np.float32
  assert yt.dtype == np.int32 and set(np.unique(yt)) == set(range(10)) == set(np.unique(yv))
  assert xt.min() == 0.0 and xt.max() == 1.0
  assert np.array_equal(digits_dataset("validation")[1], yv)
  rows = {x.tobytes() for x in xt}
  assert (
      sum(x.tobytes() in rows for x in xv) < 5
  )  # at most exact-duplicate digits repeat across splits


def test_image_batches_and_eval_weights():
  x, y = digits_dataset("validation")
  data = ImageBatches(x, y)
  a = data.batch(3, 32, seed=0)
  assert a["images"].shape == (32, 8, 8, 1) and np.array_equal(
      a["labels"], data.batch(3, 32, 0)["labels"]
  )
  assert not np.array_equal(a["labels"], data.batch(4, 32, 0)["labels"])
  evals = data.eval_batches(100)
  assert len(evals) == 4 and all(b["images"].shape[0] == 100 for b in evals)
  weights = np.concatenate([b["weights"] for b in evals])
  assert weights.sum() == len(y)
  labels = np.concatenate([b["labels"] for b in evals])[weights > 0]
  assert np.array_equal(labels, y)


def test_load_npz(tmp_path):
  path = tmp_path / "imgs.npz"
  np.savez(path, images=np.full((3, 4, 5), 255, np.uint8), labels=np.array([0, 1, 2]))
  images, labels = load_npz(path, num_classes=3)
  assert images.shape == (3, 4, 5, 1) and images.dtype == np.float32 and images.max() == 1.0
  assert labels.dtype == np.int32
  with pytest.raises(DataError, match=r"label 2 outside \[0, num_classes=2\)"):
    load_npz(path, num_classes=2)
  with pytest.raises(DataError, match="does not exist"):
    load_npz(tmp_path / "missing.npz")
  np.savez(tmp_path / "nolabels.npz", images=np.zeros((2, 4, 4, 3), np.float32))
  with pytest.raises(DataError, match=r"lacks array\(s\) \['labels'\]"):
    load_npz(tmp_path / "nolabels.npz")
  np.savez(
      tmp_path / "mismatch.npz", images=np.zeros((2, 4, 4, 3), np.float32), labels=np.array([1])
  )
  with pytest.raises(DataError, match="2 images but 1 labels"):
    load_npz(tmp_path / "mismatch.npz")
  (tmp_path / "text.jsonl").write_text('{"text": "not images"}\n')  # the wrong kind of file
  with pytest.raises(DataError, match="is not an .npz archive .*np.savez"):
    load_npz(tmp_path / "text.jsonl")


def test_a_third_tsv_column_is_refused_not_folded_into_the_target(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("one\tuno\n2\tdos\textra\n")
  with pytest.raises(DataError, match="line 2 .* 3 tab-separated columns"):
    load_tsv_pairs(path)
  with pytest.raises(DataError, match="one 'text<TAB>label' pair per line"):  # a classifier's
    load_tsv_pairs(path, columns="text<TAB>label")
  path.write_bytes(b"PK\x03\x04\xff\xfe binary")  # an archive given to a text task
  with pytest.raises(DataError, match="not valid UTF-8 .*'text<TAB>label' lines"):
    load_tsv_pairs(path, columns="text<TAB>label")


def test_nan_pixels_are_named_not_blamed_on_the_learning_rate(tmp_path):
  images = np.zeros((4, 8, 8), np.float32)
  images[2, 3, 3] = np.nan
  np.savez(tmp_path / "x.npz", images=images, labels=np.zeros(4, np.int64))
  with pytest.raises(DataError, match="image 2 holds NaN"):
    load_npz(tmp_path / "x.npz")


def test_small_user_datasets_never_validate_on_a_training_example():
  from transformers_jax.tasks.text_data import split_rows as _split_rows

  for n in (2, 5, 19, 20, 45):
    train, val = _split_rows(n, "x.tsv")
    assert val and train and not set(train) & set(val) and sorted(train + val) == list(range(n))
  with pytest.raises(DataError, match="at least 2"):
    _split_rows(1, "x.tsv")
