"""Streaming sources, the token cache, the grain pipeline, per-process rows, packing and bits
per byte (transformers_jax/data/sources.py, token_cache.py, pipeline.py)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax.data import ByteTokenizer, DataError, sources
from transformers_jax.data import pipeline as P
from transformers_jax.data.token_cache import build_cache
from transformers_jax.tasks.lm import NextTokenRows
from transformers_jax.tasks.mlm import MaskedRows

from conftest import start_python_cluster

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly numbers".split()


def documents(n, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(2, 40))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  docs = documents(300)
  (root / "c.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
  return root, docs


def quiet(_):
  pass


def test_units_read_every_line_once_in_txt_jsonl_and_parquet(tmp_path, corpus):
  root, docs = corpus
  text = "\n".join(docs) + "\n"
  (tmp_path / "a.txt").write_text(text)
  units = sources.plan_units([tmp_path / "a.txt"], unit_bytes=97)  # cuts inside lines
  assert len(units) > 10
  pieces = [t for u in units for t, _ in sources.read_unit(u)]
  assert "".join(pieces) == text
  units = sources.plan_units([root / "c.jsonl"], unit_bytes=101)
  assert [t for u in units for t, _ in sources.read_unit(u, "body")] == docs
  import pyarrow as pa
  import pyarrow.parquet as pq

  pq.write_table(pa.table({"body": docs}), tmp_path / "c.parquet", row_group_size=64)
  units = sources.plan_units([tmp_path / "c.parquet"], unit_bytes=1)
  assert len(units) == 5  # one per row group
  assert [t for u in units for t, _ in sources.read_unit(u, "body")] == docs
  with pytest.raises(DataError, match="text_field"):
    list(sources.read_unit(units[0], "text"))
  (tmp_path / "empty_dir").mkdir()
  with pytest.raises(DataError, match="no .txt, .jsonl or .parquet"):
    sources.list_files(tmp_path / "empty_dir")


def test_cache_parallel_equals_serial_resumes_and_rebuilds_a_truncated_shard(tmp_path, corpus):
  root, docs = corpus
  tok = ByteTokenizer(specials=True)
  serial = build_cache(root, tok, tmp_path / "a", 260, 1, "body", unit_bytes=2000, log=quiet)
  parallel = build_cache(root, tok, tmp_path / "b", 260, 2, "body", unit_bytes=2000, log=quiet)
  assert len(serial.shards) > 3 and serial.shards == parallel.shards

  def all_tokens(cache):
    return np.concatenate(
        [np.fromfile(cache.tokens_path(i), cache.dtype) for i in range(len(cache.shards))]
    )

  expected = np.concatenate([np.append(np.frombuffer(d.encode(), np.uint8), 258) for d in docs])
  np.testing.assert_array_equal(all_tokens(serial), expected)
  assert serial.source_bytes == sum(len(d) for d in docs)
  # a truncated shard (a crash while copying, a full disk) is noticed and tokenized again
  victim = serial.tokens_path(2)
  victim.write_bytes(victim.read_bytes()[:-5])
  logs = []
  again = build_cache(root, tok, tmp_path / "a", 260, 1, "body", unit_bytes=2000, log=logs.append)
  assert any("00002.tokens has" in m for m in logs), logs
  np.testing.assert_array_equal(all_tokens(again), expected)
  # an interrupted build (no manifest, one shard never finished) keeps the finished shards
  (serial.folder / "manifest.json").unlink()
  (serial.folder / "00001.json").unlink()
  logs = []
  resumed = build_cache(root, tok, tmp_path / "a", 260, 1, "body", unit_bytes=2000, log=logs.append)
  assert any("resuming" in m for m in logs), logs
  np.testing.assert_array_equal(all_tokens(resumed), expected)


@pytest.fixture(scope="module")
def spans(corpus, tmp_path_factory):
  root, _ = corpus
  tok = ByteTokenizer(specials=True)
  cache = build_cache(root, tok, tmp_path_factory.mktemp("cache"), 260, 1, "body", 2000, log=quiet)
  train, val = P.split_spans(cache)
  return P.TokenSpans(cache, train), P.TokenSpans(cache, val), tok


def step_batches(data, tok, kind="lm", **kw):
  """The streamed rows of the LM ("lm") or MLM ("mlm") objective's row layout."""
  layout = NextTokenRows() if kind == "lm" else MaskedRows.of(tok, 0.15)
  args = dict(layout=layout, batch_size=6, seq_len=16, seed=3, pad_id=tok.pad_id)
  return P.StepBatches(data, **{**args, **kw})


def test_rows_of_two_processes_are_disjoint_and_make_the_global_batch(spans):
  train, _, tok = spans
  for kind, packing in (("lm", False), ("mlm", True)):
    whole = step_batches(train, tok, kind=kind, packing=packing)(5)
    parts = [
        step_batches(train, tok, kind=kind, packing=packing, process_index=i, process_count=2)(5)
        for i in range(2)
    ]
    for key, value in whole.items():
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value)
    assert list(P.local_rows(7, 1, 2)) == [4, 5, 6]  # as np.array_split cuts 7 rows


def test_grain_stream_with_workers_resumes_bit_exactly(spans):
  train, _, tok = spans
  fn = step_batches(train, tok, packing=True)
  full = list(P.batch_stream(fn, 0, 6, workers=2, prefetch=2))
  resumed = list(P.batch_stream(fn, 3, 6, workers=2, prefetch=2))
  assert len(full) == 6 and len(resumed) == 3
  for step, (a, b) in enumerate(zip(full[3:], resumed), start=3):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
      np.testing.assert_array_equal(a[key], fn(step)[key])
  assert not np.array_equal(full[0]["tokens"], full[1]["tokens"])


def test_packed_rows_hold_whole_documents_with_restarting_positions(spans):
  train, _, tok = spans
  batch = step_batches(train, tok, packing=True, seq_len=63)(0)
  shard_ids, starts, ends = train.documents()
  docs = {
      tuple(train.tokens(int(i))[int(a) : int(b)].tolist())
      for i, a, b in zip(shard_ids, starts, ends)
  }
  # segment ids and positions cover the 64 tokens of each row (inputs and the last target)
  segments = np.concatenate([batch["segment_ids"], batch["segment_ids"][:, -1:]], axis=1)
  for row, seg, pos in zip(batch["tokens"], segments, batch["positions"]):
    used = seg[seg > 0]  # documents 1, 2, ... then padding (0) to the end
    assert used[0] == 1 and set(np.diff(used).tolist()) <= {0, 1}
    assert np.all(seg[: len(used)] > 0)
    for s in range(1, seg.max() + 1):
      where = np.flatnonzero(seg[:-1] == s)
      np.testing.assert_array_equal(pos[where], np.arange(len(where)))
      if s < seg.max():  # a full document (the last may run past the row's end)
        assert tuple(row[seg == s].tolist()) in docs
    assert np.all(row[seg == 0] == tok.pad_id)
  # the LM loss never predicts across a document boundary or into padding
  w, seg = batch["weights"], batch["segment_ids"]
  assert np.all(w[:, :-1][seg[:, 1:] != seg[:, :-1]] == 0)


def _per_example_logits(family):
  """Logits of two short examples packed into one row of 16, and of each alone (padded to 16,
  masked): ([16, V], [[9, V], [6, V]]), and the two examples."""
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.models import build_model

  exp = {"decoder": "gpt2", "encoder": "bert", "encoder_decoder": "transformer"}[family]
  cfg = ModelConfig.from_dict(load_config_module(f"experiments/{exp}.py").get_config("tiny").model)
  model = build_model(cfg)
  apply = model.apply  # eager: cheaper than compiling the whole model for three calls
  rng = np.random.default_rng(0)
  a, b = (rng.integers(3, 200, n).astype(np.int32) for n in (9, 6))
  row = np.concatenate([a, b, np.zeros(1, np.int32)])[None]
  seg = np.asarray([[1] * 9 + [2] * 6 + [0]], np.int32)
  pos = np.asarray([list(range(9)) + list(range(6)) + [0]], np.int32)
  alone = np.zeros((2, 16), np.int32)
  alone[0, :9], alone[1, :6] = a, b
  mask = (np.arange(16) < np.asarray([[9], [6]])).astype(np.int32)
  if family == "encoder_decoder":
    variables = model.init(jax.random.key(0), row, row)
    packing = dict(src_segments=seg, src_positions=pos, tgt_segments=seg, tgt_positions=pos)
    packed = apply(variables, row, row, packing=packing)["logits"][0]
    single = apply(variables, alone, alone, src_mask=mask, tgt_mask=mask)["logits"]
  else:
    variables = model.init(jax.random.key(0), row)
    packed = apply(variables, row, positions=pos, segment_ids=seg)["logits"][0]
    single = apply(variables, alone, attention_mask=mask)["logits"]
  return packed, [single[0, :9], single[1, :6]], (a, b)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_a_packed_row_gives_each_example_its_own_losses(family):
  packed, (alone_a, alone_b), (a, b) = _per_example_logits(family)
  logp = jax.nn.log_softmax(packed)
  np.testing.assert_allclose(logp[:9], jax.nn.log_softmax(alone_a), atol=2e-5)
  np.testing.assert_allclose(logp[9:15], jax.nn.log_softmax(alone_b), atol=2e-5)
  assert jnp.all(jnp.isfinite(packed))

  def loss(lp, targets):  # each example's summed cross-entropy on its own tokens
    return float(-jnp.take_along_axis(lp, jnp.asarray(targets)[:, None], 1).sum())

  np.testing.assert_allclose(loss(logp[:9], a), loss(jax.nn.log_softmax(alone_a), a), rtol=1e-5)
  np.testing.assert_allclose(loss(logp[9:15], b), loss(jax.nn.log_softmax(alone_b), b), rtol=1e-5)


WORKER = r"""
import json, sys
import jax
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
import ml_collections
from transformers_jax.config import ModelConfig, load_config_module
from transformers_jax.tasks.lm import NextTokenRows
from transformers_jax.tasks.stream_data import streamed_text_data
config = load_config_module("experiments/gpt2.py").get_config("tiny")
config.data.path, config.data.text_field = sys.argv[3], "body"
config.data.cache_dir, config.data.tokenize_workers = sys.argv[4], 1
config.batch_size, config.seq_len, config.eval_batches = 6, 16, 1
data = streamed_text_data(config, ModelConfig.from_dict(config.model), sys.argv[5], lambda tok: NextTokenRows(), False)
rows = [b["tokens"].tolist() for b in data.train_stream(0, 2)]
print(json.dumps({"process": jax.process_index(), "rows": rows}))
"""


def test_two_jax_processes_read_disjoint_rows_of_the_global_batch(corpus, tmp_path):
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.tasks.stream_data import streamed_text_data

  root, _ = corpus
  config = load_config_module("experiments/gpt2.py").get_config("tiny")
  config.data.path, config.data.text_field = str(root / "c.jsonl"), "body"
  config.data.cache_dir, config.data.tokenize_workers = str(tmp_path / "cache"), 1
  config.batch_size, config.seq_len, config.eval_batches = 6, 16, 1
  data = streamed_text_data(
      config,
      ModelConfig.from_dict(config.model),
      tmp_path / "w",
      lambda tok: NextTokenRows(),
      False,
  )
  # the environment of the run's other command lines: their fork servers start these processes
  # too (a PYTHONPATH of its own would start two more servers; cwd puts the checkout on the path)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = start_python_cluster(
      lambda i, address: [
          "-c",
          WORKER,
          address,
          str(i),
          config.data.path,
          config.data.cache_dir,
          str(tmp_path / "w"),
      ],
      2,
      env=env,
  )
  outs = [p.communicate(timeout=300) for p in procs]
  assert all(p.returncode == 0 for p in procs), outs[0][1][-2000:] + outs[1][1][-2000:]
  got = sorted(
      (json.loads(o[0].strip().splitlines()[-1]) for o in outs), key=lambda r: r["process"]
  )
  for step in range(2):
    mine = [np.asarray(g["rows"][step]) for g in got]
    assert len(mine[0]) == len(mine[1]) == 3
    np.testing.assert_array_equal(np.concatenate(mine), data.train_batch(step)["tokens"])


def test_training_on_packed_jsonl_resumes_bit_exactly_and_reports_bits_per_byte(corpus, tmp_path):
  from transformers_jax.config import load_config_module
  from transformers_jax.train.entry import train

  root, _ = corpus

  def config(**kw):
    c = load_config_module("experiments/gpt2.py").get_config("tiny")
    c.data.path, c.data.text_field = str(root / "c.jsonl"), "body"
    c.data.packing, c.data.tokenize_workers = True, 1
    c.steps, c.batch_size, c.seq_len, c.eval_batches = 4, 4, 16, 1
    c.log_every, c.eval_every, c.checkpoint_every, c.sample.max_new_tokens = 1, 0, 0, 0
    c.model.num_layers = 1  # a resume restores any depth alike; each of three runs compiles
    for k, v in kw.items():
      c[k] = v
    return c

  whole = train(config(), str(tmp_path / "whole"))
  train(config(stop_after=2), str(tmp_path / "split"))
  resumed = train(config(), str(tmp_path / "split"))
  assert resumed["loss"] == whole["loss"] and resumed["eval_loss"] == whole["eval_loss"]
  rows = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
  bpb = [r["eval_bits_per_byte"] for r in rows if "eval_bits_per_byte" in r]
  # byte tokens: one byte per target except the end-of-document ids, which stand for none
  assert len(bpb) == 1 and bpb[0] >= whole["eval_loss"] / np.log(2)


def test_packing_is_refused_where_it_has_no_meaning():
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.train_config import validate

  vit = load_config_module("experiments/vit.py").get_config("tiny")
  vit.data.packing, vit.data.path = True, "x.npz"  # images have no sequences to pack
  with pytest.raises(ValueError, match="data.packing"):
    validate(vit, ModelConfig.from_dict(vit.model), 1)
  gpt = load_config_module("experiments/gpt2.py").get_config("tiny")
  gpt.data.packing = True  # the bundled corpus is one token stream: nothing to pack
  with pytest.raises(ValueError, match="data.path"):
    validate(gpt, ModelConfig.from_dict(gpt.model), 1)
  gpt.data.path = "corpus.jsonl"
  validate(gpt, ModelConfig.from_dict(gpt.model), 1)
