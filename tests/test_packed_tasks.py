"""Packing for text classification and seq2seq (whole examples laid one after another in a row,
each with its own segment id), and per-process rows for every task's data."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax import models
from transformers_jax.config import ModelConfig
from transformers_jax.tasks import TASKS, task_data, task_for
from transformers_jax.train.entry import train
from transformers_jax.train_config import validate

from conftest import ROOT

SHORT_TEXTS = [
    ("import os", 0),
    ("def f(x): return x", 0),
    ("class A: pass", 0),
    ("Return the value.", 1),
    ("This module provides tools.", 1),
    ("See also the tutorial.", 1),
] * 8


def _classifier_config(experiment, tmp_path, packing):
  config = experiment("bert", "tiny")
  tsv = tmp_path / "texts.tsv"
  tsv.write_text("".join(f"{t}\t{y}\n" for t, y in SHORT_TEXTS))
  config.model.update(head="classifier", num_classes=2, num_layers=1, d_model=32, num_heads=2)
  config.update_from_flattened_dict(
      {
          "data.path": str(tsv),
          "data.packing": packing,
          "data.examples_per_row": 4,
          "batch_size": 4,
          "seq_len": 64,
          "eval_batches": 1,
      }
  )
  return config


def _seq2seq_config(experiment, packing):
  config = experiment("transformer", "tiny")
  config.model.update(num_layers=1, d_model=32, num_heads=2)
  config.update_from_flattened_dict(
      {
          "data.packing": packing,
          "data.max_number": 999,
          "data.examples_per_row": 4,
          "batch_size": 4,
          "seq_len": 48,
          "eval_batches": 1,
      }
  )
  return config


def _setup(config, tmp_path):
  model_cfg = ModelConfig.from_dict(config.model)
  validate(config, model_cfg, 1)
  task = task_for(model_cfg)
  data = task_data(task, config, model_cfg, tmp_path / "work")
  return model_cfg, task, data, models.build_model(model_cfg)


def _outputs(task, model, variables, batch):
  """(logits, targets, weights) of the task's forward pass, compiled."""
  run = jax.jit(lambda v, b: task.outputs(model, v, b, None, ["intermediates"])[0])
  return jax.device_get(run(variables, batch))


def _nll(logits, targets):
  logits = np.asarray(logits, np.float64)
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return lse - np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]


def test_a_packed_classification_batch_gives_each_example_its_unpacked_loss(experiment, tmp_path):
  config = _classifier_config(experiment, tmp_path, packing=True)
  model_cfg, task, data, model = _setup(config, tmp_path)
  batch = data.train_batch(3)
  assert batch["labels"].shape == (4, 4) and batch["starts"].shape == (4, 4)
  assert batch["weights"].sum() >= 8  # short texts: several examples in a row
  # the same examples one per row, padded
  T = config.seq_len
  rows, labels = [], []
  for r, k in zip(*np.nonzero(batch["weights"])):
    seg = batch["segment_ids"][r] == k + 1
    assert batch["starts"][r, k] == np.argmax(seg) and batch["positions"][r][seg][0] == 0
    rows.append(np.pad(batch["tokens"][r][seg], (0, T - seg.sum())))
    labels.append(batch["labels"][r, k])
  tokens = np.stack(rows)
  unpacked = {
      "tokens": tokens,
      "attention_mask": (np.arange(T) < np.array([[s] for s in (tokens != 0).sum(1)])).astype(
          np.int32
      ),
      "labels": np.array(labels, np.int32),
      "weights": np.ones(len(labels), np.float32),
  }
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.asarray(tokens[:1]))
  packed_logits, targets, weights = _outputs(task, model, variables, batch)
  one_logits, one_targets, _ = _outputs(task, model, variables, unpacked)
  packed_nll = _nll(packed_logits, targets)[np.asarray(weights) > 0]
  np.testing.assert_allclose(packed_nll, _nll(one_logits, one_targets), rtol=1e-4, atol=1e-5)


def test_a_packed_seq2seq_batch_gives_each_example_its_unpacked_loss(experiment, tmp_path):
  config = _seq2seq_config(experiment, packing=True)
  model_cfg, task, data, model = _setup(config, tmp_path)
  batch = data.train_batch(2)
  assert batch["src_segments"].max(1).min() > 1  # several pairs in every row
  variables = jax.jit(model.init)(
      jax.random.PRNGKey(0), jnp.asarray(batch["src"][:1]), jnp.asarray(batch["tgt_in"][:1])
  )
  logits, targets, weights = _outputs(task, model, variables, batch)
  token_nll = _nll(logits, targets) * np.asarray(weights)
  T = config.seq_len
  packed_losses, pieces = [], {k: [] for k in ("src", "tgt_in", "tgt_out")}
  for r in range(len(batch["src"])):
    for s in range(1, batch["src_segments"][r].max() + 1):
      src_seg, tgt_seg = batch["src_segments"][r] == s, batch["tgt_segments"][r] == s
      packed_losses.append(token_nll[r][tgt_seg].sum())
      pieces["src"].append(batch["src"][r][src_seg])
      pieces["tgt_in"].append(batch["tgt_in"][r][tgt_seg])
      pieces["tgt_out"].append(batch["tgt_out"][r][tgt_seg])
  pad = lambda xs: np.stack([np.pad(x, (0, T - len(x))) for x in xs]).astype(np.int32)  # noqa: E731
  lengths = lambda xs: (np.arange(T) < np.array([[len(x)] for x in xs])).astype(np.int32)  # noqa: E731
  unpacked = {
      "src": pad(pieces["src"]),
      "tgt_in": pad(pieces["tgt_in"]),
      "tgt_out": pad(pieces["tgt_out"]),
      "src_mask": lengths(pieces["src"]),
      "tgt_mask": lengths(pieces["tgt_in"]),
      "weights": np.ones(len(packed_losses), np.float32),
  }
  logits1, targets1, weights1 = _outputs(task, model, variables, unpacked)
  one_losses = (_nll(logits1, targets1) * np.asarray(weights1)).sum(1)
  np.testing.assert_allclose(packed_losses, one_losses, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["classify", "seq2seq"])
def test_training_runs_with_packed_rows(experiment, tmp_path, family):
  if family == "classify":
    config = _classifier_config(experiment, tmp_path, packing=True)
  else:
    config = _seq2seq_config(experiment, packing=True)
  config.update_from_flattened_dict(
      {
          "steps": 3,
          "log_every": 3,
          "eval_every": 3,
          "checkpoint_every": 3,
          "warmup_steps": 0,
          "sample.max_new_tokens": 0,
      }
  )
  result = train(config, str(tmp_path / "run"))
  assert result["step"] == 3 and np.isfinite(result["loss"]) and np.isfinite(result["eval_loss"])


def test_packing_is_refused_for_images(experiment):
  vit = experiment("vit", "tiny")
  vit.data.packing = True
  with pytest.raises(ValueError, match="data.packing"):
    validate(vit, ModelConfig.from_dict(vit.model), 1)


def test_each_task_builds_just_the_rows_asked_for(experiment, tmp_path):
  """rows(step, a, b) is the global batch of that step cut to rows [a, b), built directly."""
  configs = {
      "lm": experiment("gpt2", "tiny"),
      "mlm": experiment("bert", "tiny"),
      "classify_text": _classifier_config(experiment, tmp_path, packing=False),
      "classify_text packed": _classifier_config(experiment, tmp_path, packing=True),
      "classify_image": experiment("vit", "tiny"),
      "seq2seq": _seq2seq_config(experiment, packing=False),
      "seq2seq packed": _seq2seq_config(experiment, packing=True),
      "seq2seq tsv packed": _seq2seq_config(experiment, packing=True),
      "classify_text bundled": experiment("bert", "tiny"),
      "span_corruption": experiment("transformer", "tiny"),
      "distill": experiment("gpt2", "tiny"),  # the student's own LM rows; no teacher is read
      "prefix_lm": experiment("gpt2", "tiny"),  # the LM's rows and each row's prefix length
      "mtp": experiment("deepseek", "tiny"),  # the preset's own objective: lm's rows
  }
  configs["sft"] = experiment("gpt2", "tiny")  # conversations in the llama fixture's template
  configs["sft"].task = "sft"
  chats = tmp_path / "chats.jsonl"
  turns = lambda n: [{"role": "user", "content": "a" * (n % 7 + 1)}, {"role": "assistant", "content": "ok"}]  # noqa: E731
  chats.write_text("".join(json.dumps({"messages": turns(n)}) + "\n" for n in range(200)))
  configs["sft"].data.path = str(chats)
  configs["sft"].data.tokenizer = str(
      ROOT / "tests" / "fixtures" / "hf" / "llama" / "tokenizer.json"
  )
  configs["sft"].sft.chat_template = str(ROOT / "tests" / "fixtures" / "hf" / "llama")
  configs["prefix_lm"].task = "prefix_lm"
  configs["span_corruption"].task = "span_corruption"
  configs["span_corruption"].model.vocab_size = 288  # room for the sentinels
  configs["distill"].task = "distill"
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("".join(f"{n}\t{'x' * (n % 9 + 1)}\n" for n in range(60)))
  configs["seq2seq tsv packed"].data.path = str(pairs)
  configs["classify_text bundled"].model.update(head="classifier", num_classes=2)
  seen = set()
  for name, config in configs.items():
    config.batch_size, config.eval_batches, config.data.max_bytes = 4, 1, 200_000
    model_cfg = ModelConfig.from_dict(config.model)
    task = task_for(model_cfg, config)
    seen.add(task.name)
    data = task_data(task, config, model_cfg, tmp_path / name.replace(" ", "_"))
    assert data.train_rows is not None, name
    declared = {k: (s, np.dtype(d)) for k, (s, d) in task.batch_shapes(model_cfg, config).items()}
    for batch in (
        data.train_batch(0),
        data.eval_batches[0],
        task.synthetic_batch(model_cfg, config),
    ):
      assert {k: (v.shape, v.dtype) for k, v in batch.items()} == declared, name
    for step, (a, b) in ((0, (0, 4)), (5, (1, 3)), (7, (3, 4))):
      whole = data.train_batch(step)
      part = data.rows(step, a, b)
      assert part.keys() == whole.keys(), name
      for k in whole:
        np.testing.assert_array_equal(part[k], whole[k][a:b], err_msg=f"{name} {k}")
  assert seen == set(TASKS)
