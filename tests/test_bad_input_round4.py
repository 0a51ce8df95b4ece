"""Round four of bad inputs and faults (items 2, 3, 4, 5 and 7 of the round's report): MoE
settings that crashed or trained a dense model, a full disk during a checkpoint save, messages
that misled, fields a model silently ignored, and scripts that found a bad output path only
at the end. Each case ends in the right behaviour or one `error:` line naming the problem and
the fix. Almost everything runs in this process; the few subprocesses end before JAX starts."""

import errno
import os
import pathlib
import re
import shutil
import subprocess
import types

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


# ----------------------------------------------------------------------------- 2. MoE settings
def test_a_capacity_past_the_tokens_means_never_drop():
  """capacity_factor=1e9 made the capacity 16e9 slots, an int32 OverflowError at the first
  step; an expert meets each token of a sequence at most once, so T slots already drop
  nothing: the layer equals the one with capacity_factor = E / top_k."""
  import jax

  from transformers_jax.config import ModelConfig
  from transformers_jax.modules import moe_ragged
  from transformers_jax.modules.feed_forward import MoE

  small = dict(feed_forward="moe", num_experts=4, top_k=2, d_model=16, d_ff=32)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 16))
  exact = ModelConfig(**small, capacity_factor=2.0)  # E / top_k: a slot for every choice
  params = MoE(exact).init(jax.random.PRNGKey(1), x)["params"]
  outputs = {}
  for factor in (2.0, 1e9):
    c = exact.replace(capacity_factor=factor)
    out, state = MoE(c).apply({"params": params}, x, mutable=["losses", "moe_stats"])
    outputs[factor] = np.asarray(out)
    assert float(state["moe_stats"]["dropped_fraction"][0]) == 0.0
  np.testing.assert_allclose(outputs[1e9], outputs[2.0], rtol=1e-6, atol=1e-6)
  ragged = exact.replace(moe_impl="ragged", moe_dropless=False, capacity_factor=1e9)
  assert moe_ragged.expert_capacity(ragged, 64) == 64


def test_moe_every_past_the_depth_and_moe_fields_on_a_dense_model_are_refused(experiment):
  """moe_every=4 on 2 blocks trained a dense model until `KeyError: 'moe_stats'`, and
  param_count counted it dense; moe_impl=ragged on a dense model was ignored."""
  from transformers_jax.config import ModelConfig
  from transformers_jax.train.field_checks import check_model
  from transformers_jax.train.setup import Setup

  config = experiment("gpt2", "tiny")  # 2 blocks
  config.model.feed_forward, config.model.moe_every = "moe", 4
  with pytest.raises(ValueError, match=r"^model.moe_every=4: "):
    Setup(config)  # training refuses before anything is built
  with pytest.raises(
      ValueError, match=r"^model.moe_every=4: .* deepest stack has 2 block.*moe_every=1 to 2,"
  ):
    check_model(ModelConfig(feed_forward="moe", num_layers=2, moe_every=4))
  check_model(ModelConfig(feed_forward="moe", num_layers=2, moe_every=2))  # block 2 is MoE
  # an encoder-decoder's deepest stack counts: its decoder's 3rd block is MoE
  check_model(
      ModelConfig(
          family="encoder_decoder",
          feed_forward="moe",
          num_encoder_layers=1,
          num_decoder_layers=3,
          moe_every=3,
      )
  )
  with pytest.raises(ValueError, match=r"^model.moe_impl='ragged': .*feed_forward='dense'"):
    check_model(ModelConfig(moe_impl="ragged"))


# ----------------------------------------------------------------------------- 5. ignored fields
@pytest.mark.parametrize("field, value", [("source_len", 8), ("eval_translations", 16)])
def test_seq2seq_data_fields_on_another_model_are_refused_before_anything_is_built(
    experiment, field, value
):
  from transformers_jax.train.setup import Setup

  config = experiment("gpt2", "tiny")
  config.data[field] = value
  with pytest.raises(ValueError, match=rf"^data.{field}={value}: only a seq2seq model"):
    Setup(config)


def test_cudnn_attention_names_the_tpu_it_compiles_for(experiment):
  """A step compiled for a TPU topology from a CPU host said "this step compiles for cpu"."""
  from transformers_jax.train import compile as compile_step

  config = experiment("gpt2", "tiny")
  config.model.attention_impl = "cudnn"
  tpu = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite", coords=(0, 0, 0))
  with pytest.raises(ValueError, match=r"compiles for tpu \(TPU v5 lite devices\): use auto "):
    compile_step.report(config, devices=[tpu], verbose=False)


def test_an_imported_tokenizer_that_is_not_one_is_refused_before_anything_is_written(tmp_path):
  from transformers_jax.convert import import_hf
  from transformers_jax.errors import UserError

  shutil.copytree(FIXTURES / "gpt2", tmp_path / "model")
  for text in ("not json {", '{"model": {"type": "nothing"}}'):
    (tmp_path / "model" / "tokenizer.json").write_text(text)
    with pytest.raises(UserError, match=r"tokenizer.json is not a tokenizer this project reads"):
      import_hf(tmp_path / "model", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_member_with_from_hf_and_a_script_output_folder_for_a_file_are_one_line(tmp_path):
  out = run_python(
      ["-m", "transformers_jax.convert", "--from_hf", str(FIXTURES / "gpt2")]
      + ["--workdir", str(tmp_path / "run"), "--member", "1"]
  )
  assert "--member=1: picks the member of a population's run" in _one_error_line(out)
  assert not (tmp_path / "run").exists()
  # 7. bench_population.py --json=FOLDER ran its 160 s before it found the path was a folder
  out = run_python(["scripts/bench_population.py", f"--json={tmp_path}"], timeout=60)
  assert f"--json={tmp_path} is a folder: give the path of a file" in _one_error_line(out)
  # a depth the sweep has no population for was a StopIteration traceback
  out = run_python(["scripts/bench_population.py", "--depth=3"], timeout=60)
  assert "depth 2 or 4" in _one_error_line(out)


# ----------------------------------------------------------------------------- 7. output paths
def test_every_script_checks_its_output_paths_before_its_work(tmp_path, monkeypatch):
  from transformers_jax.scripting import output_paths
  from transformers_jax.errors import UserError

  # every flag that names where a script writes is declared, so parse_script_flags checks it
  # (those the scripts' shared helpers define for them too)
  helpers = sorted((ROOT / "transformers_jax" / "scripting").glob("*.py"))
  for script in sorted((ROOT / "scripts").glob("*.py")) + helpers:
    text = script.read_text()
    names = re.findall(r'DEFINE_string\(\s*"(out|json|trace|workdir)"', text)
    declared = re.findall(r"output_paths\.declare\(\s*(?:FLAGS|flag_values),\s*([^)]*)\)", text)
    for name in names:
      assert declared and f"{name}=" in declared[0], f"{script.name}: --{name} is not declared"
  (tmp_path / "file.txt").write_text("x")
  cases = [
      (tmp_path, output_paths.FILE, "is a folder: give the path of a file"),
      (tmp_path / "file.txt", output_paths.FOLDER, "is a file: give a folder"),
      (tmp_path / "file.txt" / "a.json", output_paths.FILE, "is a file, so no folder"),
  ]
  for path, kind, said in cases:
    with pytest.raises(UserError, match=re.escape(said)):
      output_paths.check(path, "--out", kind)
  output_paths.check(tmp_path / "new" / "deeper", "--out", output_paths.FOLDER)  # made later
  output_paths.check(tmp_path / "result.json", "--json", output_paths.FILE)

  def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")

  monkeypatch.setattr(output_paths.tempfile, "TemporaryFile", read_only)
  with pytest.raises(UserError, match=r"cannot write in .* \(Read-only file system\)"):
    output_paths.check(tmp_path / "result.json", "--json", output_paths.FILE)
  assert not (tmp_path / "new").exists()  # checking creates nothing


def test_a_relaunched_resource_tracker_is_not_told_of_blocks_it_never_saw(monkeypatch):
  """Killing Python's resource tracker made its relaunched successor print a KeyError traceback
  for every shared-memory block freed afterwards (61 in a minute of training)."""
  from multiprocessing import resource_tracker

  from transformers_jax.data import shm_tracker

  sent, alive = [], [True]
  fake = types.SimpleNamespace(_pid=100)

  def ensure_running():  # as Python's: a tracker found dead is started again, with a new pid
    if not alive[0]:
      fake._pid, alive[0] = 200, True

  fake.ensure_running = ensure_running
  fake.register = lambda name, rtype: sent.append(("REGISTER", name))
  fake.unregister = lambda name, rtype: sent.append(("UNREGISTER", name))
  monkeypatch.setattr(resource_tracker, "_resource_tracker", fake)
  for name in ("ensure_running", "register", "unregister"):
    monkeypatch.setattr(resource_tracker, name, getattr(fake, name))
  shm_tracker.guard_tracker()
  resource_tracker.register("/psm_old", "shared_memory")
  alive[0] = False  # the tracker is killed; the next message starts another
  resource_tracker.unregister("/psm_old", "shared_memory")  # the new one never heard of it
  resource_tracker.register("/psm_new", "shared_memory")
  resource_tracker.unregister("/psm_new", "shared_memory")
  assert sent == [("REGISTER", "/psm_old"), ("REGISTER", "/psm_new"), ("UNREGISTER", "/psm_new")]


# ----------------------------------------------------------------------------- 3. a full disk
# tensorstore's words for a write that found the disk full, as orbax re-raises them
FULL = (
    'RESOURCE_EXHAUSTED: Error writing "params.w/0" in OCDBT database at local file "{dir}": '
    "Failed to write 718520 bytes to file 8: No space left on device [os_error_code='28']"
)


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(tmp_path, capfd):
  """A population's save on a full disk buried its one error line (about 2,000 characters)
  among 638 lines and 57 tracebacks from orbax's threads, asyncio and tensorstore."""
  import jax.numpy as jnp
  from orbax.checkpoint._src.serialization import serialization

  from transformers_jax.run_folder.checkpoints import Checkpoints
  from transformers_jax.errors import UserError

  folder = tmp_path / "checkpoints"
  checkpoints = Checkpoints(folder)  # asynchronous, as training saves
  tree = {"params": {"w": jnp.arange(4096.0)}, "opt_state": {"mu": jnp.ones((64, 64))}}
  checkpoints.save(1, tree)
  checkpoints.wait()
  write = serialization.async_serialize_from_host

  async def disk_full(*args, **kwargs):
    raise ValueError(FULL.format(dir=folder))

  serialization.async_serialize_from_host = disk_full
  try:
    with pytest.raises(UserError) as error:
      checkpoints.save(2, tree)
      checkpoints.wait()
  finally:
    serialization.async_serialize_from_host = write
    try:
      checkpoints.manager.close()
    except Exception:  # noqa: BLE001  (the failed save's error again)
      pass
  said = str(error.value)
  assert said.startswith(f"the disk holding {folder} is full: checkpoint step 2 needs about")
  assert "the checkpoint of step 1 is intact" in said and "free at least" in said
  assert "\n" not in said and len(said) < 400
  err = capfd.readouterr().err
  assert "Traceback" not in err and "RESOURCE_EXHAUSTED" not in err, err[-3000:]
  assert sorted(p.name for p in folder.iterdir()) == ["1", "checksums.json"]  # no partial save
  assert Checkpoints(folder, async_save=False).restore_intact(None)[1] == 1


def test_a_full_token_cache_names_the_folder_and_leaves_no_partial_file(tmp_path, monkeypatch):
  from transformers_jax.data import ByteTokenizer, DataError
  from transformers_jax.data import token_cache

  (tmp_path / "corpus.txt").write_text("some text to tokenize\n" * 50)

  class FullDisk:  # open() whose files read as usual and refuse every write

    def __init__(self, path, mode="r", **kwargs):
      self.file, self.writing = open(path, mode, **kwargs), "w" in mode

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.file.close()

    def __getattr__(self, name):
      return getattr(self.file, name)

    def write(self, data):
      if self.writing:
        raise OSError(errno.ENOSPC, "No space left on device")
      return self.file.write(data)

  monkeypatch.setattr(token_cache, "open", FullDisk, raising=False)
  with pytest.raises(
      DataError,
      match=r"^No space left on device \(.*/cache/\w+/00000.tokens, [0-9,]+ bytes of the token",
  ):
    token_cache.build_cache(tmp_path / "corpus.txt", ByteTokenizer(), tmp_path / "cache", 256)
  assert not list((tmp_path / "cache").rglob("*.tmp"))
  # the bundled corpus's token files (WORKDIR/data, or data.cache_dir) likewise
  from transformers_jax.data.text import prepare_tokens

  monkeypatch.setattr(os, "fdopen", lambda fd, mode: FullDisk(fd, mode))
  with pytest.raises(
      DataError,
      match=r"^No space left on device \(.*/train.tokens, the token file\): free space in",
  ):
    prepare_tokens(["some text"] * 5, ByteTokenizer(), tmp_path / "data" / "train.tokens", 256)
  assert not list((tmp_path / "data").iterdir())


# ----------------------------------------------------------------------------- 4. messages
@pytest.mark.parametrize("shape", ["0x0", "2x2x2x2", "-2x2", "2x", "2by2"])
def test_a_topology_shape_libtpu_would_not_parse_gets_the_form_and_an_example(shape):
  from transformers_jax.machine.hardware import topology_devices

  with pytest.raises(ValueError) as error:
    topology_devices(f"v5e:{shape}")
  assert str(error.value) == (
      f"mesh.topology='v5e:{shape}': give v5e:AxB or v5e:AxBxC, the chips along each axis of a "
      "slice of TPU v5e, e.g. v5e:2x2 or v5e:4x8"
  )


def test_a_damaged_newest_checkpoint_of_a_read_only_run_is_left_and_the_older_read(
    tmp_path, monkeypatch
):
  """generate on a read-only run said "Read-only file system": setting the damaged checkpoint
  aside (a rename) failed."""
  from transformers_jax.run_folder.checkpoints import Checkpoints

  folder = tmp_path / "checkpoints"
  checkpoints = Checkpoints(folder, async_save=False)
  for step in (2, 4):
    checkpoints.save(step, {"params": {"w": np.arange(6.0) * step}})
  checkpoints.close()
  (folder / "4" / "default" / "manifest.ocdbt").unlink()

  def read_only(self, target):
    raise OSError(errno.EROFS, "Read-only file system", str(self))

  monkeypatch.setattr(pathlib.Path, "rename", read_only)
  notes = []
  checkpoints = Checkpoints(folder, async_save=False)
  tree, step = checkpoints.restore_intact(None, on_damaged=notes.append)
  assert step == 2 and float(tree["params"]["w"][1]) == 2.0
  assert len(notes) == 1 and "step 4" in notes[0] and "left in place" in notes[0]
  assert (folder / "4").is_dir()


def test_an_object_array_npz_names_the_file_the_array_and_the_fix(tmp_path):
  from transformers_jax.data import DataError
  from transformers_jax.data.images import load_npz

  ragged = np.empty(2, object)
  ragged[0], ragged[1] = np.zeros((8, 8)), np.zeros((6, 6))
  np.savez(tmp_path / "digits.npz", images=ragged, labels=np.arange(2))
  with pytest.raises(DataError) as error:
    load_npz(tmp_path / "digits.npz")
  said = str(error.value)
  assert "digits.npz' array 'images' holds Python objects" in said and "np.stack" in said


def test_a_safetensors_file_linked_to_a_device_is_named_as_such(tmp_path):
  from transformers_jax.interop import load_hf
  from transformers_jax.interop.common import CorruptCheckpoint

  (tmp_path / "m").mkdir()
  shutil.copy(FIXTURES / "gpt2" / "config.json", tmp_path / "m")
  (tmp_path / "m" / "model.safetensors").symlink_to("/dev/zero")
  with pytest.raises(CorruptCheckpoint, match=r"model.safetensors is not a regular file .*/dev/z"):
    load_hf(tmp_path / "m")


@pytest.mark.parametrize("script", ["train.sbatch", "population.sbatch", "compile_only.sbatch"])
def test_a_batch_script_run_outside_slurm_says_so(script, tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  args = ["experiments/gpt2.py:tiny", str(tmp_path / "run"), "--config.population.seeds=2"]
  out = subprocess.run(
      ["bash", f"scripts/cluster/{script}", *args],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=env,
      timeout=30,
  )
  line = _one_error_line(out)
  assert line.startswith(f"error: {script} is a SLURM batch script and this is not a SLURM job")


def test_an_unknown_field_is_named_not_the_valid_one_after_it():
  """ml_collections names the unknown part ('distill', or 'd_modl' with a hint); the line named
  the last override whatever it was."""
  from transformers_jax import cli

  cases = [
      ("\"'distill'\"", ["--config.distill.teacher", "--config.sample.max_new_tokens"]),
      (
          "'\\'d_modl\\'\\nDid you mean \"d_model\" instead of \"d_modl\"?'",
          ["--config.model.d_model", "--config.model.d_modl", "--config.steps"],
      ),
  ]
  for error, overrides in cases:
    unknown = next(o for o in overrides if "distill" in o or "d_modl" in o)
    assert cli._unknown_override(error, overrides) == unknown
