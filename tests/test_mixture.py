"""Weighted mixtures of text sources (transformers_jax/data/mixture.py, tasks/stream_data.py):
rows in the weights' proportions with a schedule, tokens seen per source, per-process rows,
bit-exact resumes, held-out losses per source, and bad mixtures as one line."""

import json
import pickle

import jax
import numpy as np
import pytest

from transformers_jax.data import DataError
from transformers_jax.data.mixture import parse_mixture, stages
from transformers_jax.tasks.base import cross_entropy
from transformers_jax.tasks.lm import NextTokenRows
from transformers_jax.tasks.mlm import MaskedRows

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly numbers".split()
B, T = 16, 16


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """Three sources told apart by their characters: lowercase (a.jsonl), uppercase (b.txt) and
  digits (a save_to_disk folder, `digits`)."""
  root = tmp_path_factory.mktemp("mixture")
  rng = np.random.default_rng(0)
  docs = [" ".join(rng.choice(WORDS, rng.integers(2, 30))) for _ in range(200)]
  (root / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  (root / "b.txt").write_text("\n".join(d.upper() for d in docs))
  numbers = [" ".join(str(n) for n in rng.integers(0, 10**6, rng.integers(2, 20))) for _ in docs]
  import datasets  # (imported here: collecting the tests should not pay for it)

  datasets.disable_progress_bars()
  datasets.Dataset.from_dict({"text": numbers}).save_to_disk(str(root / "digits"))
  return root


def spec(root, b="0.3"):
  return f"{root}/a.jsonl:0.5,{root}/b.txt:{b},{root}/digits:0.2"


def mixture_data(root, workdir, mixture, kind="lm", packing=False):
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.tasks.stream_data import streamed_text_data

  config = load_config_module("experiments/gpt2.py").get_config("tiny")
  config.data.mixture, config.data.packing = mixture, packing
  config.data.cache_dir, config.data.tokenize_workers = str(root / "cache"), 1
  config.batch_size, config.seq_len, config.eval_batches = B, T, 1
  config.model.vocab_size = 256 if kind == "lm" else 260  # MLM: the byte tokenizer's specials
  layout = (lambda tok: NextTokenRows()) if kind == "lm" else (lambda tok: MaskedRows.of(tok, 0.15))
  return streamed_text_data(
      config, ModelConfig.from_dict(config.model), workdir, layout, kind != "lm"
  )


def source_of_row(tokens) -> int:
  """0, 1 or 2: the source whose characters the row holds (lowercase, uppercase, digits)."""
  t = np.asarray(tokens)
  counts = [np.sum((t >= a) & (t <= b)) for a, b in ((97, 122), (65, 90), (48, 57))]
  return int(np.argmax(counts))


def test_rows_follow_the_weights_and_the_tokens_seen_count_them(sources, tmp_path):
  steps = 250
  for packing in (False, True):
    data = mixture_data(sources, tmp_path / "w", spec(sources), packing=packing)
    rows, real = np.zeros(3), np.zeros(3)
    for step in range(steps):
      batch = data.train_batch(step)
      for i, row in enumerate(batch["tokens"]):
        s = source_of_row(row)
        rows[s] += 1
        real[s] += batch["segment_ids"][i].astype(bool).sum() if packing else T
    np.testing.assert_allclose(rows / rows.sum(), [0.5, 0.3, 0.2], atol=1 / (steps * B))
    np.testing.assert_allclose(real / real.sum(), [0.5, 0.3, 0.2], rtol=0.02)  # within 2 %
    seen = data.step_metrics(steps)
    assert seen == {f"tokens_seen/{n}": int(c * T) for n, c in zip(("a", "b", "digits"), rows)}
  # the MLM objective reads the same rows through its own layout
  mlm = mixture_data(sources, tmp_path / "m", spec(sources), kind="mlm").train_batch(3)
  assert set(mlm) == {"inputs", "labels", "weights"} and mlm["inputs"].shape == (B, T)


def test_a_schedule_changes_the_weights_at_its_step_and_the_counts_follow(sources, tmp_path):
  mixture = spec(sources, b="0.3|3@40")  # b: 30 % of the rows, from step 40 on 3 / 3.7 of them
  assert [s for s, _ in stages(parse_mixture(mixture))] == [0, 40]
  fn = mixture_data(sources, tmp_path / "w", mixture).train_batch
  drawn, ks = np.zeros(3, np.int64), [[], [], []]
  for n in range(80 * B):
    if n % 400 == 0 or n in (40 * B - 1, 40 * B, 40 * B + 1):
      np.testing.assert_array_equal(fn.rows_drawn(n), drawn)
    source, k = fn.source_of(n)
    drawn[source] += 1
    ks[source].append(k)
  assert drawn[1] == 0.3 * 40 * B + round(3 / 3.7 * 40 * B)
  # each source's stream goes on where it stood when the weights change: its k-th row is the
  # same whatever the weights (rows depend on (seed, source, k) alone)
  assert all(k == list(range(len(k))) for k in ks)


def test_process_rows_make_the_batch_and_a_resume_or_a_worker_gives_the_same(sources, tmp_path):
  data = mixture_data(sources, tmp_path / "w", spec(sources), packing=True)
  whole = data.train_batch
  for step in (0, 7):
    parts = [type(whole)(whole.parts, whole.sources, i, 2)(step) for i in range(2)]
    for key, value in whole(step).items():
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value)
  full = list(data.train_stream(0, 6))
  resumed = list(data.train_stream(3, 6))
  copied = pickle.loads(pickle.dumps(whole))  # as grain's worker processes receive it
  for step, (a, b) in enumerate(zip(full[3:], resumed), start=3):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
      np.testing.assert_array_equal(a[key], copied(step)[key])
  # held-out batches: eval_batches from each source, each marked with its source
  sources_of = [int(np.argmax(b["source"][0])) for b in data.eval_batches]
  assert sources_of == [0, 1, 2] and data.source_names == ["a", "b", "digits"]
  for b in data.eval_batches:
    assert all(source_of_row(r) == int(np.argmax(b["source"][0])) for r in b["tokens"])


def test_sums_per_source_add_up_to_the_whole_and_match_each_alone():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 5, 11)).astype(np.float32)
  targets = rng.integers(0, 11, (6, 5))
  weights = (rng.random((6, 5)) > 0.3).astype(np.float32)
  source = np.asarray([0, 2, 2, 1, 0, 2])
  groups = np.eye(3, dtype=np.float32)[source]
  sums = jax.jit(lambda *a: cross_entropy(*a, groups=groups))(logits, targets, weights)
  log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  nll = (log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]) * weights
  np.testing.assert_allclose(float(sums["nll"]), nll.sum(), rtol=1e-5)
  for g in range(3):  # each source's sums are those of its rows alone
    np.testing.assert_allclose(sums["source_nll"][g], nll[source == g].sum(), rtol=1e-5)
    np.testing.assert_allclose(sums["source_weight"][g], weights[source == g].sum())


def test_training_on_a_mixture_resumes_bit_exactly_and_logs_each_source(sources, tmp_path):
  from transformers_jax.config import load_config_module
  from transformers_jax.train.entry import train

  def config(**kw):
    c = load_config_module("experiments/gpt2.py").get_config("tiny")
    c.data.mixture, c.data.packing, c.data.tokenize_workers = spec(sources), True, 1
    c.data.cache_dir = str(sources / "cache")
    c.steps, c.batch_size, c.seq_len, c.eval_batches = 4, 4, 16, 1
    c.log_every, c.eval_every, c.checkpoint_every, c.sample.max_new_tokens = 1, 0, 0, 0
    for k, v in kw.items():
      c[k] = v
    return c

  whole = train(config(), str(tmp_path / "whole"))
  train(config(stop_after=2), str(tmp_path / "split"))
  resumed = train(config(), str(tmp_path / "split"))
  names = ("a", "b", "digits")
  for key in ["loss", "eval_loss"] + [
      f"{m}/{n}" for m in ("eval_loss", "tokens_seen") for n in names
  ]:
    assert resumed[key] == whole[key], key
  rows = [json.loads(x) for x in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
  logged = [r for r in rows if "loss" in r]
  assert [r["step"] for r in logged] == [1, 2, 3, 4]
  assert [sum(r[f"tokens_seen/{n}"] for n in names) for r in logged] == [64, 128, 192, 256]
  (evaluation,) = [r for r in rows if "eval_loss" in r and r["step"] == 4]
  per_source = [evaluation[f"eval_loss/{n}"] for n in names]
  assert all(np.isfinite(per_source)) and min(per_source) < evaluation["eval_loss"] < max(
      per_source
  )
  assert all(f"eval_bits_per_byte/{n}" in evaluation for n in names)


@pytest.mark.parametrize(
    "mixture, said",
    [
        ("a.txt", "'a.txt' has no weight; write PATH:WEIGHT"),
        ("a.txt:lots", "weight 'lots' is not a number"),
        ("a.txt:0.5,b.txt:0", "'b.txt:0' never has a weight > 0, so it would never be read"),
        ("a.txt:-1", "weight '-1' must be a finite number >= 0"),
        ("a.txt:nan", "weight 'nan' must be a finite number >= 0"),
        ("a.txt:1,,b.txt:1", "an empty source"),
        ("a.txt:1|2@50|3@20", "each later weight names its first step, after the one before"),
        ("a.txt:1@5", "the first weight holds from step 0"),
        ("a.txt:1|0@10,b.txt:0|1@20", "from step 10 every weight is 0"),
        ("a.txt:1,b.txt:1e-5", "the weights 1e-05 and 1 differ by more than 10,000 times"),
    ],
)
def test_a_bad_mixture_is_one_line(mixture, said):
  with pytest.raises(DataError, match="data.mixture=") as caught:
    parse_mixture(mixture)
  assert said in str(caught.value) and "\n" not in str(caught.value)


def test_mixture_settings_that_cannot_work_are_refused_before_reading(sources, tmp_path):
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.train_config import validate

  gpt = load_config_module("experiments/gpt2.py").get_config("tiny")
  gpt.data.mixture, gpt.data.path = spec(sources), str(sources / "a.jsonl")
  with pytest.raises(ValueError, match="data.mixture=.*leave data.path empty"):
    validate(gpt, ModelConfig.from_dict(gpt.model), 1)
  bert = load_config_module("experiments/bert.py").get_config("classify")
  bert.data.mixture = spec(sources)
  with pytest.raises(ValueError, match="data.mixture=.*this run trains classify_text"):
    validate(bert, ModelConfig.from_dict(bert.model), 1)
  with pytest.raises(DataError, match="data.mixture source '.*missing.txt' does not exist"):
    mixture_data(sources, tmp_path / "w", f"{sources}/a.jsonl:1,{sources}/missing.txt:1")
