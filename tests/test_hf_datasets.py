"""Hugging Face dataset folders as text sources (transformers_jax/data/hf_datasets.py): a
save_to_disk Dataset or DatasetDict, the hub's .parquet / .arrow shards split by name, one .arrow
file; read in row ranges, in order, every row once; bad input is one line."""

import json
import sys

import numpy as np
import pytest

from transformers_jax.data import DataError, sources

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly numbers".split()


def documents(n, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(2, 30))) for _ in range(n)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  import datasets  # (imported here: collecting the tests should not pay for it)

  datasets.disable_progress_bars()
  root = tmp_path_factory.mktemp("hf")
  docs = documents(240)
  whole = datasets.Dataset.from_dict({"text": docs, "number": list(range(len(docs)))})
  whole.save_to_disk(str(root / "saved"), max_shard_size="4KB")  # several .arrow shards
  held = datasets.Dataset.from_dict({"text": docs[:7], "number": list(range(7))})
  datasets.DatasetDict({"train": whole, "test": held}).save_to_disk(str(root / "dict"))
  (root / "hub" / "data").mkdir(parents=True)
  for name, part in (("train-00000-of-00002", docs[:100]), ("train-00001-of-00002", docs[100:])):
    datasets.Dataset.from_dict({"text": part}).to_parquet(str(root / f"hub/data/{name}.parquet"))
  held.to_parquet(str(root / "hub/data/test-00000-of-00001.parquet"))
  (root / "hub" / "README.md").write_text("---\nlicense: mit\n---\n")  # a dataset card
  return root, docs


def texts(path, split="train", unit_bytes=500, field="text"):
  units = sources.plan_units(sources.list_files(path, split), unit_bytes, field)
  return units, [t for u in units for t, ends in sources.read_unit(u, field) if ends]


def test_a_save_to_disk_folder_is_read_in_row_ranges_every_row_once_in_order(folders):
  root, docs = folders
  files = sources.list_files(root / "saved")
  assert len(files) > 2 and all(f.suffix == ".arrow" for f in files)
  units, got = texts(root / "saved")
  assert len(units) > len(files)  # shards cut into row ranges of about unit_bytes
  assert got == docs
  assert texts(root / "dict")[1] == docs  # a DatasetDict: data.split, "train" by default
  assert texts(root / "dict", "test")[1] == docs[:7]
  assert texts(files[0])[1] == docs[: len(texts(files[0])[1])]  # one .arrow file alone


def test_the_hubs_shards_give_the_split_their_names_say(folders):
  root, docs = folders
  train = sources.list_files(root / "hub")
  assert [f.name for f in train] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
  assert texts(root / "hub")[1] == docs
  assert texts(root / "hub", "test")[1] == docs[:7]


def test_a_dataset_folder_trains_through_the_token_cache(folders, tmp_path):
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.tasks.lm import NextTokenRows
  from transformers_jax.tasks.stream_data import streamed_text_data

  root, docs = folders
  config = load_config_module("experiments/gpt2.py").get_config("tiny")
  config.data.path, config.data.split = str(root / "dict"), "train"
  config.data.cache_dir, config.data.tokenize_workers = str(tmp_path / "cache"), 1
  config.batch_size, config.seq_len, config.eval_batches = 4, 16, 1
  model_cfg = ModelConfig.from_dict(config.model)
  data = streamed_text_data(config, model_cfg, tmp_path / "w", lambda tok: NextTokenRows(), False)
  separator = 2  # the byte tokenizer ends each document with "\n\n"
  assert f"{sum(len(d) + separator for d in docs):,} byte tokens" in data.summary
  assert data.train_batch(0)["tokens"].shape == (4, 17)
  from transformers_jax.data.token_cache import build_cache

  # another split: another cache, of its rows only
  held = build_cache(root / "dict", data.tokenizer, tmp_path / "cache", 256, split="test")
  assert held.num_tokens == sum(len(d) + separator for d in docs[:7])


def test_bad_dataset_input_is_one_line(folders, monkeypatch, tmp_path):
  root, _ = folders
  for path in (root / "dict", root / "hub"):
    with pytest.raises(DataError, match="holds the splits train, test, not 'valid'.*data.split"):
      sources.list_files(path, "valid")
  with pytest.raises(DataError, match="has no column 'body' \\(columns: text, number\\)"):
    texts(root / "saved", field="body")
  with pytest.raises(DataError, match="column 'number' holds int64, not text"):
    texts(root / "saved", field="number")
  (tmp_path / "broken").mkdir()
  (tmp_path / "broken" / "state.json").write_text(json.dumps({"_data_files": []}))
  with pytest.raises(DataError, match="cannot load it"):
    sources.list_files(tmp_path / "broken")
  one_file = sources.list_files(root / "dict")[0]
  monkeypatch.setitem(sys.modules, "datasets", None)  # as if the package were not installed
  for path in (root / "saved", root / "hub", one_file):
    with pytest.raises(DataError, match=r"`datasets` package.*pip install 'transformers_jax\[hf"):
      texts(path)
