"""Tasks: every objective owns its batch layout (the data it makes has exactly those shapes), and
a new objective is one Task subclass that train() and --compile_only take as it is."""

import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax.config import ModelConfig
from transformers_jax.tasks import TASKS, Task, TaskData, task_data, task_for
from transformers_jax.train import compile as compile_step
from transformers_jax.train.entry import train

PRESETS = {
    "lm": ("gpt2", "tiny"),
    "mlm": ("bert", "tiny"),
    "seq2seq": ("transformer", "tiny"),
    "classify_image": ("vit", "tiny"),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_data_a_task_makes_has_the_layout_it_declares(experiment, tmp_path, name):
  config = experiment(*PRESETS[name])
  config.batch_size, config.eval_batches = 4, 1
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_for(model_cfg)
  assert task is TASKS[name]
  data = task_data(task, config, model_cfg, tmp_path)
  declared = task.batch_shapes(model_cfg, config)
  for batch in (data.train_batch(0), data.eval_batches[0], task.synthetic_batch(model_cfg, config)):
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: (shape, np.dtype(dtype)) for k, (shape, dtype) in declared.items()
    }


class EchoTokens(Task):
  """A toy objective written for this test: each position predicts its own token (no shift),
  which a causal model can learn from the token alone."""

  name = "echo_tokens"

  def batch_shapes(self, model_cfg, config):
    return {"tokens": ((config.batch_size, config.seq_len), np.int32)}

  def outputs(self, model, variables, batch, rngs, mutable):
    out, state = model.apply(variables, batch["tokens"], rngs=rngs, mutable=mutable)
    return (out["logits"], batch["tokens"], jnp.ones(batch["tokens"].shape)), state

  def data(self, config, model_cfg, workdir):
    B, T = config.batch_size, config.seq_len

    def batch(step):
      rng = np.random.default_rng([config.seed, step])
      return {"tokens": rng.integers(0, 16, (B, T)).astype(np.int32)}

    return TaskData(batch, [batch(10**6)], summary="echo each token")


def test_a_new_objective_is_one_task_class(experiment, tmp_path):
  config = experiment("gpt2", "tiny")
  config.update_from_flattened_dict(
      {
          "steps": 60,
          "batch_size": 8,
          "seq_len": 16,
          "log_every": 20,
          "eval_every": 60,
          "eval_batches": 1,
          "checkpoint_every": 60,
          "warmup_steps": 0,
          "learning_rate": 3e-3,
          "sample.max_new_tokens": 0,
      }
  )
  result = train(config, str(tmp_path / "run"), task=EchoTokens())
  assert result["step"] == 60
  assert result["eval_loss"] < 0.5 * np.log(16)  # echoing beats guessing among 16 tokens
  report = compile_step.report(config, verbose=False, task=EchoTokens())
  assert report["tokens_per_step"] == 8 * 16 and report["per_device_peak_estimate_gib"] > 0


def test_accuracy_counts_the_largest_logit_without_argmax():
  """cross_entropy's "correct": random rows agree with argmax; a target tied for the largest
  logit counts; a row of equal real logits (a zero-initialised head) predicts nothing, also
  with padded classes masked far below."""
  from transformers_jax.tasks.base import cross_entropy

  rng = np.random.default_rng(0)
  logits = rng.normal(size=(64, 10)).astype(np.float32)
  targets = rng.integers(0, 10, 64)
  weights = np.ones(64, np.float32)
  sums = cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights))
  assert float(sums["correct"]) == float(np.sum(logits.argmax(-1) == targets))
  tied = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], np.float32)
  padded = np.concatenate([np.zeros((1, 3)), np.full((1, 5), -1e9)], axis=1).astype(np.float32)
  one = jnp.ones(1, jnp.float32)
  assert float(cross_entropy(tied[:1], jnp.array([2]), one)["correct"]) == 1.0  # tied at the top
  assert float(cross_entropy(tied[:1], jnp.array([0]), one)["correct"]) == 0.0
  assert float(cross_entropy(tied[1:], jnp.array([0]), one)["correct"]) == 0.0  # all equal
  assert float(cross_entropy(padded, jnp.array([0]), one, num_classes=3)["correct"]) == 0.0
  assert float(cross_entropy(padded[:, :4] + [[0, 1, 0, 0]], jnp.array([1]), one)["correct"]) == 1


def test_the_registry_is_listed_in_config_help_and_config_task_picks_from_it(experiment):
  from transformers_jax import config_reference

  config = experiment("gpt2", "tiny")
  text = config_reference.help_text(config, "gpt2.py:tiny")
  for name, task in TASKS.items():
    assert f"    {name}: {task.summary}" in text
  assert "  task = ''" in text
  model_cfg = ModelConfig.from_dict(config.model)
  config.task = "lm"
  assert task_for(model_cfg, config) is TASKS["lm"]


def test_an_unknown_or_unfitting_task_is_one_error_naming_the_choices(experiment):
  from transformers_jax.errors import UserError
  from transformers_jax.train_config import validate

  config = experiment("gpt2", "tiny")
  model_cfg = ModelConfig.from_dict(config.model)
  config.task = "nope"
  with pytest.raises(UserError) as e:
    validate(config, model_cfg, 1)
  assert str(e.value) == (
      f"task='nope': no such objective; choose one of {', '.join(TASKS)} (--config_help "
      "describes them), or leave it empty for the model's own"
  )
  config.task = "seq2seq"
  with pytest.raises(ValueError, match=r"^task='seq2seq': trains encoder_decoder models and this"):
    validate(config, model_cfg, 1)


def test_the_steps_name_no_objective_and_config_and_data_do_not_branch_on_the_model():
  """The train step and evaluation read whatever sums the Task returns; the training config's
  checks and the data pipeline ask the Task, not the model's family or head."""
  import pathlib
  import re

  root = pathlib.Path(__file__).resolve().parent.parent / "transformers_jax"
  objective_names = re.compile(
      r"\b(cross_entropy|nll|correct|label_smoothing|num_classes|real_classes|accuracy|"
      r"perplexity|logit_sum|logit_max|eval_bits_per_byte)\b"
  )
  for path in (root / "train" / "step.py", root / "train" / "evaluation.py"):
    found = objective_names.findall(path.read_text())
    assert not found, f"{path.name} names {sorted(set(found))}"
  model_branch = re.compile(r"\.(family|head_kind)\b|\bmodel_cfg\.head\b")
  for path in [root / "train_config.py", *sorted((root / "data").glob("*.py"))]:
    code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
    assert not model_branch.search(code), f"{path.name} branches on {model_branch.search(code)}"
