"""Round five of bad inputs, part A: LoRA adapters lost by `init_from` into another rank, LoRA
ranks and targets that mean nothing, a failed `convert --from_hf` that blocked its own rerun,
the closing note of a converted encoder-decoder, and integer weights in a Hugging Face folder.
Each case ends in the right behaviour or one `error:` line naming the problem and the fix. Most
checks call the code in this process; the one subprocess ends before JAX starts."""

import pathlib
import subprocess

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "hf"


def _one_error_line(out: subprocess.CompletedProcess) -> str:
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith("error: ")
  return lines[0]


def _flat(tree) -> dict:
  return {
      jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


# ----------------------------------------------------------------------------- 1. init_from
def test_init_from_a_lora_run_into_another_rank_merges_its_adapters(experiment, tmp_path):
  """A rank-4 model started from a rank-2 LoRA run kept the run's base weights and dropped its
  trained adapters (their shapes differ): it now starts from the adapted model, the run's
  adapters merged into the kernels, with fresh rank-4 adapters (B = 0)."""
  from transformers_jax.config import ModelConfig
  from transformers_jax.models import lora, param_shapes
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.train.setup import Setup

  config = experiment("gpt2", "tiny")
  config.model.lora_rank, config.model.lora_alpha, config.model.lora_targets = 2, 4.0, "q,v,mlp_in"
  source_cfg = ModelConfig.from_dict(config.model)
  rng = np.random.default_rng(0)
  # a trained run's parameters: every tensor, the adapters' B included, away from zero
  params = jax.tree_util.tree_map(
      lambda s: rng.normal(0, 0.1, s.shape).astype(np.float32), param_shapes(source_cfg)
  )
  source = Run(tmp_path / "lora2")
  source.save_params(params)
  source.write_config(config)
  config.model.lora_rank, config.init_from = 4, str(source.path)
  setup = Setup(config)
  state, start, note = setup.start(Run(tmp_path / "lora4").checkpoints(async_save=False))
  assert start == 0
  assert note.endswith(
      "its rank-2 LoRA adapters were merged into the weights (W + 2 A B) and this model's "
      "rank-4 adapters start fresh"
  ), note
  merged, _ = lora.merged(params, source_cfg)
  got, want = _flat(jax.device_get(state.params)), _flat(merged)
  for name, value in want.items():  # every base tensor: the run's, its adapters folded in
    np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
  adapters = {n: v for n, v in got.items() if n not in want}
  assert {n.split("/")[-2] for n in adapters} == {"query", "value", "wi"}
  for name, value in adapters.items():
    if name.endswith("lora_a"):
      assert value.shape[-1] == 4, name
    else:  # B starts at zero: the model starts as the merged one
      assert name.endswith("lora_b") and not value.any(), name


# ----------------------------------------------------------------------------- 2. LoRA fields
@pytest.mark.parametrize(
    "fields, target, sides",
    [
        (dict(), "q", (64, 64)),
        (dict(num_kv_heads=1, lora_targets="q,k"), "k", (64, 16)),  # one kv head of 16
        (dict(num_heads=2, head_dim=8, lora_targets="out"), "out", (16, 64)),
        (dict(d_ff=12, activation="swiglu", lora_targets="q,mlp_in"), "mlp_in", (64, 12)),
        (dict(d_ff=12, lora_targets="mlp_out"), "mlp_out", (12, 64)),
    ],
)
def test_a_lora_rank_above_an_adapted_matrix_is_refused(fields, target, sides):
  """model.lora_rank=100000 on a 64-wide model trained 51M adapter parameters."""
  from transformers_jax.config import ModelConfig

  base = ModelConfig(**{"d_model": 64, "num_heads": 4, **fields})
  limit = min(sides)
  for rank in (limit + 1, 100000):
    with pytest.raises(ValueError) as error:
      base.replace(lora_rank=rank)
    assert str(error.value) == (
        f"model.lora_rank={rank}: above {limit}, the smaller side of the adapted {target} "
        f"projection ({sides[0]} x {sides[1]}): at most {limit}"
    )
  base.replace(lora_rank=limit)  # a full-rank update is allowed


def test_lora_targets_without_a_rank_are_refused_before_anything_is_built(experiment):
  from transformers_jax.config import ModelConfig
  from transformers_jax.train.field_checks import check_model
  from transformers_jax.train.setup import Setup

  config = experiment("gpt2", "tiny")
  config.model.lora_targets = "q,k"
  with pytest.raises(ValueError) as error:
    Setup(config)
  assert str(error.value) == (
      "model.lora_targets='q,k': read only with model.lora_rank > 0: set a rank (e.g. "
      "--config.model.lora_rank=8) or leave lora_targets at its default (q,v)"
  )
  check_model(ModelConfig(lora_targets="v, q"))  # the default, written otherwise
  check_model(ModelConfig(lora_rank=2, lora_targets="q,k"))


def test_a_run_saved_with_lora_targets_and_no_rank_resumes_with_them_at_their_default(tmp_path):
  """A full fine-tune started from a LoRA run's config (lora_rank=0, its targets kept) before
  such targets were refused: resuming it as the refusal says (targets at their default) is the
  same model."""
  import ml_collections

  from transformers_jax.errors import UserError
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.train.resume import check_same_model

  run = Run(tmp_path / "run")
  saved = ml_collections.ConfigDict({"model": {"lora_rank": 0, "lora_targets": "q,k,v"}})
  run.write_config(saved)
  check_same_model(
      run, ml_collections.ConfigDict({"model": {"lora_rank": 0, "lora_targets": "q,v"}})
  )
  with pytest.raises(UserError, match=r"different model \(model.lora_rank \(0 saved, 2 now\)"):
    check_same_model(
        run, ml_collections.ConfigDict({"model": {"lora_rank": 2, "lora_targets": "q,k,v"}})
    )
