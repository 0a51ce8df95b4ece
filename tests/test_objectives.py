"""The two objectives built on the Task seam, each one module and one registry line: T5 span
corruption for the encoder-decoder, and distillation from a teacher run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax.config import ModelConfig
from transformers_jax.tasks import TASKS, task_data, task_for
from transformers_jax.tasks.distill import soft_kl
from transformers_jax.tasks.span_corruption import SpanRows, corrupt, noise_counts, window_length
from transformers_jax.train.entry import train
from transformers_jax.train_config import validate

TOP = 299  # the highest id: sentinel 0


def restored(source, target, top=TOP):
  """The window a (source, target) pair was made from: each sentinel of the source replaced by
  the span that follows it in the target."""
  spans, current = {}, None
  for t in target:
    if t > top - 50:
      current = spans.setdefault(t, [])
    else:
      current.append(t)
  return [x for t in source for x in (spans[t] if t in spans else [t])]


def test_span_corruption_drops_t5s_share_of_tokens_in_spans_it_can_restore():
  rng = np.random.default_rng(0)
  for n in (2, 7, 70, 200):
    ids = rng.integers(0, 250, n).tolist()
    source, target = corrupt(ids, np.random.default_rng(n), 0.15, 3.0, TOP)
    noise, spans = noise_counts(n, 0.15, 3.0)
    assert restored(source, target) == ids
    sentinels = [t for t in source if t > 250]
    assert sentinels == [TOP - i for i in range(spans)]  # one per span, from the top down
    assert len(target) == noise + spans and len(source) == n - noise + spans
  assert noise_counts(200, 0.15, 3.0) == (30, 10)  # round(0.15 n) noise in round(noise / 3) spans
  assert window_length(64, 64, 0.15, 3.0) == 70  # 70 - 10 + 3 sentinels + eos = 64 source tokens


def test_packed_span_rows_corrupt_each_document_on_its_own():
  layout = SpanRows(48, 48, 48, 0.15, 3.0, TOP, 0, 257, 258)
  tokens = np.arange(1, 49)[None].astype(np.int32)
  segments = np.repeat([1, 2, 3, 0], [20, 15, 10, 3])[None].astype(np.int32)
  row = layout.finish(tokens, segments, None, 0, 0, range(1))
  examples = []
  for s in (1, 2, 3):
    src = row["src"][0][row["src_segments"][0] == s].tolist()
    tgt = row["tgt_out"][0][row["tgt_segments"][0] == s].tolist()
    assert src[-1] == tgt[-1] == 258  # eos ends each side
    examples.append(restored(src[:-1], tgt[:-1]))
  assert examples == [list(range(1, 21)), list(range(21, 36)), list(range(36, 46))]


def test_span_corruption_streams_and_packs_a_users_corpus(experiment, tmp_path):
  """A JSONL corpus through the token cache, whole documents packed in rows: every packed source
  segment, its spans put back from its target segment, is a piece of one document's text."""
  texts = [f"text {i}: " + "a word " * (i % 4) for i in range(300)]
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("".join(json.dumps({"text": x}) + "\n" for x in texts))
  config = experiment("transformer", "tiny")
  config.task = "span_corruption"
  config.update_from_flattened_dict(
      {"model.vocab_size": 400, "data.path": str(corpus), "data.packing": True, "batch_size": 4}
  )
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_for(model_cfg, config)
  data = task_data(task, config, model_cfg, tmp_path / "run")
  declared = {k: (s, np.dtype(d)) for k, (s, d) in task.batch_shapes(model_cfg, config).items()}
  eos, pieces = data.tokenizer.eos_id, 0
  for batch in (data.train_batch(0), data.train_batch(5), data.eval_batches[0]):
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == declared
    for r in range(batch["src"].shape[0]):
      for s in set(batch["src_segments"][r].tolist()) - {0}:
        src = batch["src"][r][batch["src_segments"][r] == s].tolist()
        tgt = batch["tgt_out"][r][batch["tgt_segments"][r] == s].tolist()
        assert src[-1] == tgt[-1] == eos
        ids = restored(src[:-1], tgt[:-1], top=399)
        if ids[-1] == eos:  # a piece that ends its document keeps the cache's end-of-document id
          ids = ids[:-1]
        text = bytes(ids).decode()
        assert any(text in x for x in texts), text
        pieces += 1
  assert pieces > 12  # several documents to a row
  np.testing.assert_array_equal(data.train_batch(5)["src"], data.train_batch(5)["src"])


def test_span_corruption_pretrains_the_encoder_decoder_on_the_corpus(experiment, tmp_path):
  config = experiment("transformer", "tiny")
  config.task = "span_corruption"
  config.update_from_flattened_dict(
      {
          "model.vocab_size": 264,
          "model.num_layers": 1,
          "steps": 40,
          "batch_size": 8,
          "log_every": 20,
          "eval_every": 20,
          "eval_batches": 2,
          "checkpoint_every": 40,
          "warmup_steps": 5,
          "sample.max_new_tokens": 0,
      }
  )
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_for(model_cfg, config)
  assert task is TASKS["span_corruption"]
  data = task_data(task, config, model_cfg, tmp_path / "run")
  declared = task.batch_shapes(model_cfg, config)
  assert {k: v.shape for k, v in data.train_batch(0).items()} == {
      k: s for k, (s, _) in declared.items()
  }
  train(config, str(tmp_path / "run"))
  evals = [
      json.loads(line)["eval_loss"]
      for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
      if "eval_loss" in line
  ]
  assert len(evals) == 2 and evals[1] < evals[0] < np.log(264)
  config.model.vocab_size = 262  # 2 free ids, 3 spans a window
  with pytest.raises(
      ValueError, match=r"span corruption's sentinels .*model.vocab_size=263 or more"
  ):
    task.data(config, ModelConfig.from_dict(config.model), tmp_path / "other")


def test_the_distillation_loss_is_kl_to_the_softened_teacher():
  rng = np.random.default_rng(0)
  student, teacher = (jnp.asarray(rng.normal(size=(2, 3, 7)), jnp.float32) for _ in range(2))
  weights = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
  assert abs(float(soft_kl(teacher, teacher, weights, 2.0))) < 1e-6
  p = jax.nn.softmax(teacher / 2.0)
  kl = jnp.sum(p * (jnp.log(p) - jax.nn.log_softmax(student / 2.0)), -1)
  np.testing.assert_allclose(soft_kl(student, teacher, weights, 2.0), jnp.sum(kl * weights), 1e-5)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  from conftest import ROOT
  from transformers_jax.config import load_config_module

  config = load_config_module(str(ROOT / "experiments" / "gpt2.py")).get_config("tiny")
  config.update_from_flattened_dict(
      {
          "model.num_layers": 1,
          "steps": 30,
          "batch_size": 8,
          "seq_len": 32,
          "log_every": 30,
          "eval_every": 30,
          "eval_batches": 1,
          "checkpoint_every": 30,
          "sample.max_new_tokens": 0,
      }
  )
  workdir = tmp_path_factory.mktemp("teacher") / "run"
  train(config, str(workdir))
  return config, workdir


def test_a_distilled_student_learns_the_teachers_distribution(teacher, tmp_path):
  config, teacher_dir = teacher
  config = config.copy_and_resolve_references()
  config.task, config.distill.teacher, config.distill.alpha = "distill", str(teacher_dir), 1.0
  config.eval_every, config.steps, config.seed = 15, 30, 1
  result = train(config, str(tmp_path / "student"))
  rows = [json.loads(line) for line in (tmp_path / "student" / "metrics.jsonl").open()]
  kl = [r["eval_distill_kl"] for r in rows if "eval_distill_kl" in r]
  assert len(kl) == 2 and kl[1] < kl[0]  # alpha 1: only the teacher is learnt from
  assert np.isfinite(result["eval_loss"]) and any("distill_kl" in r for r in rows)
  assert (tmp_path / "student" / "tokenizer.json").read_bytes() == (
      teacher_dir / "tokenizer.json"
  ).read_bytes()


def test_distillation_settings_are_checked_before_anything_is_built(teacher, experiment):
  config, teacher_dir = teacher
  config = config.copy_and_resolve_references()
  model_cfg = ModelConfig.from_dict(config.model)
  config.task = "distill"
  with pytest.raises(ValueError, match=r"^distill.teacher='': give the teacher's run"):
    validate(config, model_cfg, 1)
  config.distill.teacher = str(teacher_dir)
  validate(config, model_cfg, 1)
  config.distill.alpha = 1.5
  with pytest.raises(ValueError, match=r"^distill.alpha=1.5: the soft term's weight lies in"):
    validate(config, model_cfg, 1)
  bert = experiment("bert", "tiny")
  bert.task, bert.distill.teacher = "distill", str(teacher_dir)
  with pytest.raises(ValueError, match=r"a decoder model .* cannot teach this encoder model"):
    validate(bert, ModelConfig.from_dict(bert.model), 1)


def test_a_distilled_population_member_equals_its_solo_run(teacher, tmp_path):
  """Distillation in a population (two learning rates, one vmapped program, the teacher's
  parameters shared): member 0 logs the losses, distillation terms and held-out figures of
  the same student distilled alone."""
  config, teacher_dir = teacher
  config = config.copy_and_resolve_references()
  config.task, config.distill.teacher = "distill", str(teacher_dir)
  config.update_from_flattened_dict(
      {"steps": 8, "log_every": 2, "eval_every": 8, "checkpoint_every": 8, "seed": 3}
  )
  train(config, str(tmp_path / "solo"))
  config.population.learning_rates = f"({config.learning_rate}, {config.learning_rate * 3})"
  train(config, str(tmp_path / "population"))

  def logged(workdir, member=None):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
    return [r for r in rows if r.get("member") == member and ("loss" in r or "eval_loss" in r)]

  solo, member = logged(tmp_path / "solo"), logged(tmp_path / "population", 0)
  assert [r["step"] for r in member] == [r["step"] for r in solo] and len(solo) == 5
  assert "distill_kl" in solo[0] and "eval_distill_kl" in solo[-1]
  for mine, alone in zip(member, solo):
    for key in ("loss", "distill_kl", "eval_loss", "eval_distill_kl"):
      if key in alone:
        assert mine[key] == pytest.approx(alone[key], rel=1e-5), (mine["step"], key)
  other = logged(tmp_path / "population", 1)
  assert other[-1]["eval_loss"] != pytest.approx(member[-1]["eval_loss"], rel=1e-4)
