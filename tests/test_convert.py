"""python -m transformers_jax.convert: Hugging Face directory <-> a run other commands accept."""

import json

import jax
import numpy as np
import pytest

from transformers_jax.errors import UserError
from transformers_jax.config import ModelConfig, load_config_module
from transformers_jax.train_config import config_from_json
from transformers_jax.convert import export_hf, import_hf
from transformers_jax.interop import load_hf
from transformers_jax.models import build_model
from transformers_jax.modules.block import scan_to_loop
from transformers_jax.run_folder.checkpoints import Checkpoints

from conftest import ROOT, run_python

FIXTURES = ROOT / "tests" / "fixtures" / "hf"


def leaves_equal(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_import_writes_a_run_and_export_gives_the_same_weights(tmp_path):
  fields, params = load_hf(FIXTURES / "gpt2")
  import_hf(FIXTURES / "gpt2", tmp_path / "run", scan_layers=True)
  config = load_config_module(str(tmp_path / "run" / "config.py")).get_config()
  assert config.to_dict() == config_from_json(tmp_path / "run" / "config.json").to_dict()
  model_cfg = ModelConfig.from_dict(config.model)
  assert model_cfg.scan_layers and model_cfg.family == "decoder"
  restored = Checkpoints(tmp_path / "run" / "checkpoints").restore(0, None)["params"]
  leaves_equal(scan_to_loop(restored), params)
  # the converted run computes what the Hugging Face model computed
  ref = np.load(FIXTURES / "gpt2" / "reference.npz", allow_pickle=False)
  tokens = ref["tokens"]
  logits = build_model(model_cfg).apply({"params": restored}, tokens)["logits"]
  np.testing.assert_allclose(np.asarray(logits), ref["logits"], atol=1e-4)
  assert export_hf(tmp_path / "run", tmp_path / "back") == "GPT2LMHeadModel"
  back_fields, back = load_hf(tmp_path / "back")
  leaves_equal(back, params)
  assert {k: v for k, v in back_fields.items() if k != "scan_layers"} == {
      k: v for k, v in fields.items() if k != "scan_layers"
  }
  # an export never replaces files it was not asked to: not the run's own, not another model's
  config_before = (tmp_path / "run" / "config.json").read_text()
  for target in (tmp_path / "run", tmp_path / "run" / "inner", tmp_path / "back"):
    with pytest.raises(UserError, match="own folder|already holds files"):
      export_hf(tmp_path / "run", target)
  assert (tmp_path / "run" / "config.json").read_text() == config_before
  assert export_hf(tmp_path / "run", tmp_path / "back", overwrite=True) == "GPT2LMHeadModel"


def test_convert_cli_errors_are_one_line(tmp_path):
  out = run_python(
      [
          "-m",
          "transformers_jax.convert",
          "--from_hf",
          str(tmp_path),
          "--workdir",
          str(tmp_path / "o"),
      ]
  )
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1].startswith("error: ")
  assert "config.json" in out.stderr


def test_generate_on_converted_gpt2_equals_the_reference_greedy_continuation(tmp_path):
  ref = np.load(FIXTURES / "gpt2" / "reference.npz", allow_pickle=False)
  prompt, greedy = ref["prompt"][0].tolist(), ref["greedy"][0].tolist()
  out = run_python(
      [
          "-m",
          "transformers_jax.convert",
          "--from_hf",
          str(FIXTURES / "gpt2"),
          "--workdir",
          str(tmp_path / "run"),
      ]
  )
  assert out.returncode == 0, out.stderr[-2000:]
  out = run_python(
      [
          "-m",
          "transformers_jax.generate",
          "--workdir",
          str(tmp_path / "run"),
          "--prompt_ids",
          ",".join(map(str, prompt)),
          "--print_ids",
          "--temperature",
          "0",
          "--max_new_tokens",
          str(len(greedy)),
      ]
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert [int(t) for t in out.stdout.strip().splitlines()[-1].split(",")] == greedy


def test_bert_export_writes_the_run_tokenizers_pad_id(tmp_path):
  from transformers_jax.data import make_tokenizer

  import_hf(FIXTURES / "bert_mlm", tmp_path / "run")
  tokenizer = make_tokenizer("byte", 260, specials=True)
  tokenizer.save(tmp_path / "run" / "tokenizer.json")
  export_hf(tmp_path / "run", tmp_path / "hf")
  written = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert tokenizer.pad_id not in (None, 0)
  assert written["pad_token_id"] == tokenizer.pad_id


def test_training_in_a_converted_run_starts_from_its_parameters(tmp_path):
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.run_folder.checkpoints import PARAMS_ONLY
  from transformers_jax.train.entry import train

  import_hf(FIXTURES / "vit_classifier", tmp_path / "run")
  run = Run(tmp_path / "run")
  assert run.checkpoints(async_save=False).kind(0) == PARAMS_ONLY
  imported, _ = run.load_params()
  rng = np.random.default_rng(0)
  np.savez(
      tmp_path / "images.npz",
      images=rng.random((40, 12, 12, 3)).astype(np.float32),
      labels=rng.integers(0, 5, 40),
  )
  config = run.config()
  config.update_from_flattened_dict(
      {
          "steps": 2,
          "batch_size": 4,
          "log_every": 1,
          "eval_every": 0,
          "eval_batches": 1,
          "checkpoint_every": 2,
          "warmup_steps": 0,
          "learning_rate": 1e-9,
          "data.path": str(tmp_path / "images.npz"),
      }
  )
  result = train(config, str(run.path))
  assert result["step"] == 2 and run.latest_step() == 2
  trained, _ = run.load_params()
  for a, b in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(imported)):
    np.testing.assert_allclose(a, b, atol=1e-6)  # two steps at a learning rate of 1e-9
