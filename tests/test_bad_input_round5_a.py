"""Round five of bad inputs, part A: LoRA adapters lost by `init_from` into another rank, LoRA
ranks and targets that mean nothing, a failed `convert --from_hf` that blocked its own rerun,
the closing note of a converted encoder-decoder, and integer weights in a Hugging Face folder.
Each case ends in the right behaviour or one `error:` line naming the problem and the fix. Most
checks call the code in this process; one runs `convert` as a user does."""

import errno
import pathlib
import shutil
import subprocess

import jax
import numpy as np
import pytest

from conftest import run_python

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


# ----------------------------------------------------------------------------- 3. convert
def test_a_convert_that_fails_removes_what_it_wrote_so_the_same_command_runs_again(
    tmp_path, monkeypatch
):
  """A full disk during `convert --from_hf` said "run the same command again", which then
  found the checkpoints/ folder the failed save had made and refused ("already holds
  checkpoints")."""
  from orbax.checkpoint._src.serialization import serialization

  from transformers_jax.convert import import_hf
  from transformers_jax.errors import UserError
  from transformers_jax.run_folder.runs import Run

  async def disk_full(*args, **kwargs):  # every tensor's write, as tensorstore meets the disk
    raise OSError(errno.ENOSPC, "No space left on device")

  run = tmp_path / "run"
  with monkeypatch.context() as patch:
    patch.setattr(serialization, "async_serialize_from_host", disk_full)
    with pytest.raises(UserError, match=r"is full: .* then run the same command again"):
      import_hf(FIXTURES / "gpt2", run)
  assert not run.exists()  # it made the folder: all of it goes
  # the last write (config.json, after the checkpoint and the other files) fails in a folder
  # that held a file of the user's: the file stays, the rest goes
  run.mkdir()
  (run / "notes.txt").write_text("mine")
  with monkeypatch.context() as patch:

    def write_config(self, config):
      raise OSError(errno.ENOSPC, "No space left on device", str(self.config_path))

    patch.setattr(Run, "write_config", write_config)
    with pytest.raises(OSError, match="No space left"):
      import_hf(FIXTURES / "gpt2", run)
  assert [p.name for p in run.iterdir()] == ["notes.txt"]
  import_hf(FIXTURES / "gpt2", run)  # the same command
  assert Run(run).latest_step() == 0 and (run / "config.json").is_file()


def _interrupted_convert(run: pathlib.Path) -> None:
  """What a convert killed (kill -9) during its checkpoint save leaves: the checksum record and
  orbax's temporary folder of step 0, no config.json."""
  partial = run / "checkpoints" / "0.orbax-checkpoint-tmp" / "default.orbax-checkpoint-tmp"
  partial.mkdir(parents=True)
  (partial / "d").mkdir()
  (partial.parent / "_CHECKPOINT_METADATA").write_text("{}")
  (run / "checkpoints" / "checksums.json").write_text("{}")


def test_a_rerun_replaces_what_an_interrupted_convert_left_and_nothing_else(tmp_path, capsys):
  """A convert killed mid-write left checkpoints/0.orbax-checkpoint-tmp and no config.json;
  the rerun was refused ("already holds checkpoints") without naming the leftover."""
  from transformers_jax.convert import _check_workdir, import_hf
  from transformers_jax.errors import UserError
  from transformers_jax.run_folder.runs import Run

  run = tmp_path / "run"
  _interrupted_convert(run)
  (run / "config.py").write_text("# half of convert's files")
  import_hf(FIXTURES / "gpt2", run)
  note = capsys.readouterr().out.strip().splitlines()
  assert note == [
      f"note: {run} held what an interrupted convert left (checkpoints, config.py) and no "
      "config.json: replaced"
  ]
  assert Run(run).latest_step() == 0
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0", "checksums.json"]
  # a finished convert (config.json) or a run is never replaced
  with pytest.raises(UserError, match=r"already holds checkpoints: convert into a new --workdir"):
    _check_workdir(Run(run))
  (run / "config.json").unlink()  # a training run's step beside convert's step 0
  (run / "checkpoints" / "100").mkdir()
  with pytest.raises(UserError, match=r"already holds checkpoints"):
    _check_workdir(Run(run))
  # leftovers beside a file convert does not write: named, and nothing is touched
  other = tmp_path / "other"
  _interrupted_convert(other)
  (other / "notes.txt").write_text("mine")
  with pytest.raises(UserError) as error:
    _check_workdir(Run(other))
  assert str(error.value) == (
      f"{other} holds what an interrupted convert left (checkpoints) beside other files "
      "(notes.txt): remove checkpoints from it, or convert into a new --workdir"
  )
  assert (other / "checkpoints" / "0.orbax-checkpoint-tmp").is_dir()


# ----------------------------------------------------------------------------- 4. convert's note
@pytest.mark.parametrize(
    "fixture, flags",
    [
        ("t5", ("--source", "--source_ids")),
        ("bart", ("--source", "--source_ids")),
        ("gpt2", ("--prompt", "--prompt_ids")),
        ("bert", None),
    ],
)
def test_the_no_tokenizer_note_names_the_flags_of_the_models_family(fixture, flags, tmp_path):
  """For T5 and BART the note said --prompt_ids works: generate refuses it for an
  encoder-decoder, which reads --source_ids."""
  from transformers_jax.convert import tokenizer_note
  from transformers_jax.interop import load_hf

  fields, _ = load_hf(FIXTURES / fixture)
  note = tokenizer_note(fields["family"], FIXTURES / fixture, tmp_path)
  if flags is None:  # generate does not run an encoder
    assert note is None
    return
  text, ids = flags
  assert note == (
      f"note: {FIXTURES / fixture} has no tokenizer.json, so {tmp_path} has no tokenizer: "
      f"generate {text} needs one (copy the model's tokenizer.json into {tmp_path}); {ids} "
      "works without"
  )
  (tmp_path / "tokenizer.json").write_text("{}")
  assert tokenizer_note(fields["family"], FIXTURES / fixture, tmp_path) is None


# ----------------------------------------------------------------------------- 5. integer weights
def _with_tensor(tmp_path, name: str, convert) -> pathlib.Path:
  """A copy of the GPT-2 fixture whose tensor `name` is `convert(tensor)`."""
  from safetensors.numpy import load_file, save_file

  folder = tmp_path / "gpt2"
  shutil.copytree(FIXTURES / "gpt2", folder, dirs_exist_ok=True)
  tensors = load_file(str(folder / "model.safetensors"))
  tensors[name] = convert(tensors[name])
  save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
  return folder


@pytest.mark.parametrize("dtype", ["int32", "int8", "bool"])
def test_integer_weights_in_a_hugging_face_folder_are_refused(tmp_path, dtype):
  """An int32 c_attn weight was imported (cast to float32) as if it were one."""
  from transformers_jax.interop import load_hf
  from transformers_jax.interop.common import CorruptCheckpoint

  name = "transformer.h.0.attn.c_attn.weight"
  folder = _with_tensor(tmp_path, name, lambda w: (w * 100).astype(dtype))
  with pytest.raises(CorruptCheckpoint) as error:
    load_hf(folder)
  assert str(error.value) == (
      f"{folder}: tensor {name} holds {dtype} values: a weight is read from floating-point "
      "values only (float32, float16, bfloat16; quantized integer weights are not read): use "
      "the model's floating-point checkpoint"
  )


def test_convert_of_integer_weights_is_one_line_and_writes_nothing(tmp_path):
  name = "transformer.h.0.attn.c_attn.weight"
  folder = _with_tensor(tmp_path, name, lambda w: w.astype("int32"))
  out = run_python(
      ["-m", "transformers_jax.convert", "--from_hf", str(folder)]
      + ["--workdir", str(tmp_path / "run")]
  )
  assert f"tensor {name} holds int32 values" in _one_error_line(out)
  assert not (tmp_path / "run").exists()


def test_bfloat16_weights_load_and_their_nan_is_refused(tmp_path):
  """bfloat16 is floating-point (numpy does not count it as np.floating): it loads, and a NaN
  in it, which the finiteness check skipped, is refused like float32's."""
  import ml_dtypes

  from transformers_jax.interop import load_hf
  from transformers_jax.interop.common import CorruptCheckpoint

  name = "transformer.h.0.mlp.c_fc.weight"
  folder = _with_tensor(tmp_path, name, lambda w: w.astype(ml_dtypes.bfloat16))
  _, params = load_hf(folder)
  kernel = params["decoder"]["layer_0"]["ffn"]["wi"]["kernel"]
  assert kernel.dtype == np.float32 and kernel.any()
  folder = _with_tensor(tmp_path, name, lambda w: np.full_like(w, np.nan, ml_dtypes.bfloat16))
  with pytest.raises(CorruptCheckpoint, match=rf"tensor {name} holds NaN or infinite values"):
    load_hf(folder)
