"""Round three of bad inputs and faults: each case ends in the right behaviour or one clear
error naming the problem and the fix (packing of long documents, exports that would lose a run
or a tensor, impossible settings, changed data, hostile Hugging Face folders, silent
acceptance of nonsense values)."""

import json
import pathlib
import re

import numpy as np
import pytest

from transformers_jax.data import ByteTokenizer
from transformers_jax.data import pipeline as P
from transformers_jax.data.token_cache import build_cache
from transformers_jax.tasks.lm import NextTokenRows

from conftest import run_python

ROOT = pathlib.Path(__file__).resolve().parent.parent


def quiet(_):
  pass


# ----------------------------------------------------------------------------- 1. packing
@pytest.fixture(scope="module")
def one_long_document(tmp_path_factory):
  """A .txt corpus that is one document of 6,000 byte tokens (the cache adds one separator)."""
  root = tmp_path_factory.mktemp("long")
  rng = np.random.default_rng(0)
  text = "".join(chr(c) for c in rng.integers(97, 123, 6000))
  (root / "book.txt").write_text(text)
  cache = build_cache(root / "book.txt", ByteTokenizer(), root / "cache", 256, 1, log=quiet)
  train, val = P.split_spans(cache)
  return P.TokenSpans(cache, train), P.TokenSpans(cache, val), train[0], val[0]


def test_packing_trains_on_every_piece_of_a_long_document(one_long_document):
  train, val, train_span, val_span = one_long_document
  common = dict(layout=NextTokenRows(), batch_size=8, seq_len=63, seed=1, packing=True, pad_id=0)
  batches = P.StepBatches(train, **common)
  seen = np.zeros(train_span.hi, bool)
  text = train.tokens(0)[: train_span.hi].tobytes()
  for step in range(60):
    batch = batches(step)
    # each row is one piece of the document: 64 tokens, positions 0..62, nothing masked out
    assert np.all(batch["segment_ids"] == 1) and np.all(batch["weights"] == 1)
    np.testing.assert_array_equal(batch["positions"][0], np.arange(63))
    for row in batch["tokens"]:
      start = text.find(row.astype(np.uint8).tobytes())
      assert start >= 0, "a packed row that is not a piece of the training text"
      seen[start : start + 64] = True
  # 480 rows drawn over the ~95 pieces: every part of the training text is reached (before the
  # fix every row was the document's first 64 tokens)
  assert seen.mean() > 0.95
  # the held-out rows are packed the same way, from the held-out tail only
  evals = P.packed_eval_rows(P.StepBatches(val, **{**common, "batch_size": 4, "seed": 2}), 1)
  assert len(evals) == 1 and set(evals[0]) == {"tokens", "segment_ids", "positions", "weights"}
  held_out = val.tokens(0)[val_span.lo : val_span.hi].tobytes()
  for row in evals[0]["tokens"]:
    assert held_out.find(row.astype(np.uint8).tobytes()) >= 0


# ----------------------------------------------------------------------------- 2, 3. export
FIXTURES = ROOT / "tests" / "fixtures" / "hf"


def test_export_never_overwrites_another_run(tmp_path):
  from transformers_jax.errors import UserError
  from transformers_jax.convert import export_hf, import_hf

  import_hf(FIXTURES / "gpt2", tmp_path / "a")
  import_hf(FIXTURES / "gpt2", tmp_path / "b")
  before = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir() if p.is_file()}
  with pytest.raises(UserError, match="holds a run"):
    export_hf(tmp_path / "a", tmp_path / "b", overwrite=True)
  after = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir() if p.is_file()}
  assert after == before


def test_export_refuses_what_the_architecture_cannot_hold(tmp_path, monkeypatch):
  import jax

  from transformers_jax.config import ModelConfig
  from transformers_jax.interop import hf_export, save_hf
  from transformers_jax.interop.common import UnsupportedConfig
  from transformers_jax.models import param_shapes

  c = ModelConfig(num_layers=1, d_model=16, num_heads=2, max_len=8, qk_norm=True)
  params = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), param_shapes(c))
  with pytest.raises(UnsupportedConfig, match="qk_norm"):
    save_hf(tmp_path / "out", c, params)
  # whatever a field check misses: a parameter no tensor holds is refused, never dropped
  monkeypatch.setattr(hf_export, "_check_exportable", lambda c, architecture: None)
  with pytest.raises(UnsupportedConfig, match="query_norm|key_norm.*has no tensor for them"):
    save_hf(tmp_path / "out", c, params)
  assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- 4. hangs
def test_more_examples_per_row_than_a_row_can_hold_is_refused():
  from transformers_jax.config import ModelConfig, load_config_module
  from transformers_jax.train_config import validate

  config = load_config_module(str(ROOT / "experiments" / "transformer.py")).get_config("tiny")
  config.data.packing, config.data.examples_per_row = True, 100000
  with pytest.raises(ValueError, match="data.examples_per_row=100000: a row of seq_len="):
    validate(config, ModelConfig.from_dict(config.model), 1)


def test_a_signal_before_the_first_step_ends_the_run_at_once():
  import os
  import signal

  from transformers_jax.errors import AbortedBeforeStart
  from transformers_jax.train.preemption import StopRequests

  before = signal.getsignal(signal.SIGTERM)
  stop = StopRequests(abort_before_start=True)
  try:
    with pytest.raises(AbortedBeforeStart, match=r"interrupted \(SIGTERM\) before the first step"):
      os.kill(os.getpid(), signal.SIGTERM)
      signal.pause()  # (the handler raises here at the latest)
    # code that swallows every exception (JAX's compilation-cache reads) loses the raise, not
    # the signal: it stays a request, honoured at the first step boundary
    stop.started()
    assert stop.stop_at(1) and stop.signal_name == "SIGTERM"
    stop.requested = False
    # after the first step a signal is a request to save at a step boundary
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.stop_at(1) and stop.signal_name == "SIGTERM"
  finally:
    stop.restore()
  assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_swallowed_before_the_first_step_still_ends_the_run():
  """A signal during the setup whose raise something caught (JAX's compilation-cache reads catch
  every exception): the step loop's own StopRequests takes the request over and ends the run
  before its first step (a Ctrl-C 2 s into a run was lost: the run trained to the end, exit 0)."""
  import os
  import signal

  from transformers_jax.errors import AbortedBeforeStart
  from transformers_jax.train.preemption import StopRequests

  before = signal.getsignal(signal.SIGINT)
  setup_phase = StopRequests(abort_before_start=True)
  try:
    try:
      os.kill(os.getpid(), signal.SIGINT)
      signal.pause()
    except AbortedBeforeStart:
      pass  # swallowed
    with pytest.raises(AbortedBeforeStart, match=r"interrupted \(SIGINT\) before the first"):
      StopRequests(abort_before_start=True)
    assert signal.getsignal(signal.SIGINT) == setup_phase._handle  # put back as it was
    later = StopRequests()  # past the first step: a request to save at the next boundary
    assert later.stop_at(1) and later.signal_name == "SIGINT"
    later.restore()
  finally:
    setup_phase.restore()
  assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_after_the_steps_says_the_run_is_saved():
  """Once the step loop's StopRequests has run steps and handed the signals back, a signal in
  the run's last part (the end-of-run sample) is a stop with everything saved (exit 75), not
  "before the first step: nothing was trained or saved"."""
  import os
  import signal

  from transformers_jax.errors import InterruptedAfterRun
  from transformers_jax.train.preemption import StopRequests

  setup_phase = StopRequests(abort_before_start=True)
  try:
    steps = StopRequests(abort_before_start=True)
    steps.started()
    steps.restore()
    with pytest.raises(
        InterruptedAfterRun, match=r"interrupted \(SIGINT\) after the last step.* saved"
    ):
      os.kill(os.getpid(), signal.SIGINT)
      signal.pause()
  finally:
    setup_phase.restore()


WATCHDOG = """
import os, signal, threading
from transformers_jax.train.preemption import StopRequests
stop = StopRequests(abort_before_start=True)
try:
  os.kill(os.getpid(), signal.SIGINT)
  signal.pause()
except Exception:
  pass  # as if the main thread were held in a call that never returns to Python
threading.Event().wait(120)
print("still running")
"""


def test_a_main_thread_that_does_not_return_is_ended_by_the_watchdog():
  import subprocess
  import sys

  out = subprocess.run(
      [sys.executable, "-c", WATCHDOG], capture_output=True, text=True, cwd=ROOT, timeout=100
  )
  assert out.returncode == 2 and "still running" not in out.stdout
  assert out.stderr.strip().splitlines() == [
      "error: interrupted (SIGINT) before the first step, while the data was prepared or the "
      "step compiled: nothing was trained or saved; run the same command again to start"
  ]


ABORT_AT_ONCE = """
import atexit
from transformers_jax import cli
from transformers_jax.errors import AbortedBeforeStart
atexit.register(lambda: print("interpreter shutdown ran", flush=True))
def main():
  print("started", flush=True)
  raise AbortedBeforeStart("interrupted (SIGINT) before the first step")
cli._one_line_errors(main)
"""


def test_an_abort_before_the_first_step_skips_the_interpreter_shutdown():
  """A signal that broke into a compilation can leave XLA's state such that its cleanup at exit
  crashes (exit 139 instead of 2): the abort's error line is printed (stdout flushed first) and
  the process ends without the interpreter's shutdown."""
  import subprocess
  import sys

  out = subprocess.run([sys.executable, "-c", ABORT_AT_ONCE], capture_output=True, text=True)
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stdout.splitlines() == ["started"]  # printed, and no shutdown ran
  assert out.stderr.strip().splitlines()[-1] == (
      "error: interrupted (SIGINT) before the first step"
  )


CONFIG_FILES = {
    "config.json": '{"model": {"d_model": 32}, "packing": false}\n',  # a run's, not an experiment
    "syntax.py": "def get_config(:\n",
    "imports.py": "import no_such_module_here\n\ndef get_config():\n  return None\n",
}


@pytest.mark.parametrize(
    "args,needles",
    [
        (
            ["--config.model.d-model=32"],
            ["--config.model.d-model: no such config field", "--config.model.d_model?"],
        ),
        (["--config.warmup-steps=2"], ["did you mean --config.warmup_steps?"]),
        (["--config=FILES/config.json"], ["config.json", "NameError: name 'false'"]),
        (["--config=FILES/syntax.py"], ["syntax.py", "SyntaxError"]),
        (["--config=FILES/imports.py"], ["No module named 'no_such_module_here'"]),
        (["--config=FILES/missing.py"], ["missing.py' (no such file)"]),
    ],
)
def test_config_files_and_field_names_that_cannot_work_are_one_line_errors(args, needles, tmp_path):
  """Hyphenated field names and config files that are not experiment files, or fail to run,
  are named with the cause in the one error line (they were tracebacks, or hid the cause)."""
  from absl import flags

  from transformers_jax import cli

  for name, text in CONFIG_FILES.items():
    (tmp_path / name).write_text(text)
  args = [a.replace("FILES", str(tmp_path)) for a in args]
  if not any(a.startswith("--config=") for a in args):
    args = [f"--config={ROOT / 'experiments' / 'gpt2.py'}:tiny", *args]
  flag_values = flags.FlagValues()
  cli.define_config_flag(flag_values=flag_values)
  rest, message = cli._parse(flag_values, ["prog", *args])
  assert rest == [] and message is not None and "\n" not in message
  for needle in needles:
    assert needle in message, message


def test_a_negative_seed_is_refused_with_the_other_fields(experiment):
  from transformers_jax.config import ModelConfig
  from transformers_jax.train_config import validate

  config = experiment("gpt2", "tiny")
  config.seed = -1
  with pytest.raises(ValueError, match="seed=-1: must be an integer >= 0"):
    validate(config, ModelConfig.from_dict(config.model), 1)
  config.seed, config.eval_every = 0, -1  # and a negative interval says what 0 means for it
  with pytest.raises(ValueError, match=r"eval_every=-1: must be >= 0 \(0 evaluates only at"):
    validate(config, ModelConfig.from_dict(config.model), 1)


def test_cudnn_attention_off_a_gpu_is_refused_in_one_line():
  """attention_impl=cudnn on a CPU (or compiled for a TPU) is the user's choice to correct, not a
  RuntimeError from inside jax.nn.dot_product_attention."""
  import jax.numpy as jnp

  from transformers_jax.modules.attention import choose_impl

  q = jnp.zeros((1, 8, 2, 4))
  with pytest.raises(ValueError, match="attention_impl='cudnn' needs an NVIDIA GPU.*cpu"):
    choose_impl("cudnn", q, q, dropout=False)
  assert choose_impl("cudnn", q, q, dropout=True) == "einsum"  # dropout's path, as before
  assert choose_impl("auto", q, q, dropout=False) == "einsum"


def test_resumed_metrics_do_not_glue_onto_a_torn_last_line(tmp_path):
  """A process killed mid-write leaves a last line without its newline; the resumed run's
  writer cuts it (it was never a whole record) instead of appending onto it."""
  from transformers_jax.train.metrics import MetricsWriter

  whole = json.dumps({"step": 6, "loss": 2.5}) + "\n"
  (tmp_path / "metrics.jsonl").write_text(whole + '{"step": 7, "lo')
  writer = MetricsWriter(tmp_path)
  writer.write(7, {"loss": 2.4})
  writer.close()
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in lines] == [6, 7]
  writer = MetricsWriter(tmp_path)  # a whole last line is kept as it is
  writer.close()
  assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(coordinator_address="localhost:1", num_processes=2, process_id=5), "id from 0 to"),
        (dict(coordinator_address="localhost:1", num_processes=0, process_id=0), "N >= 1"),
        (dict(coordinator_address="localhost", num_processes=2, process_id=0), "localhost:12355"),
        (dict(num_processes=2), "give all three, or neither"),
    ],
)
def test_process_flags_that_cannot_join_are_refused_before_joining(kwargs, needle):
  """An id past the count waited out the join timeout (300 s) before saying so; an address
  without a port was an IndexError from inside JAX; a count without an address was ignored."""
  from transformers_jax.machine.cluster_join import initialize_distributed
  from transformers_jax.errors import UserError

  with pytest.raises(UserError, match=re.escape(needle)):
    initialize_distributed(**kwargs)


# ----------------------------------------------------------------------------- 5. run folders
@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
  """A checkpoint folder with steps 2 and 4 of a small train-state-like tree."""
  from transformers_jax.run_folder.checkpoints import Checkpoints

  folder = tmp_path_factory.mktemp("ckpt") / "checkpoints"
  checkpoints = Checkpoints(folder, async_save=False)
  for step in (2, 4):
    tree = {"params": {"w": np.arange(6.0) * step}, "opt_state": {"count": np.int32(step)}}
    checkpoints.save(step, tree)
  checkpoints.close()
  return folder


def _copy(folder, tmp_path):
  import shutil

  shutil.copytree(folder, tmp_path / "checkpoints")
  return tmp_path / "checkpoints"


@pytest.mark.parametrize("lost", ["default/_METADATA", "default/manifest.ocdbt", "default"])
def test_a_checkpoint_missing_a_file_falls_back_to_the_older_one(two_steps, tmp_path, lost):
  import shutil

  from transformers_jax.run_folder.checkpoints import FULL_STATE, Checkpoints

  folder = _copy(two_steps, tmp_path)
  path = folder / "4" / lost
  shutil.rmtree(path) if path.is_dir() else path.unlink()
  checkpoints = Checkpoints(folder, async_save=False)
  assert checkpoints.kind(4) == FULL_STATE  # (a TypeError before)
  notes = []
  tree, step = checkpoints.restore_intact(None, on_damaged=notes.append)
  checkpoints.close()
  assert step == 2 and float(tree["params"]["w"][1]) == 2.0
  assert len(notes) == 1 and "step 4" in notes[0] and "missing" in notes[0]


@pytest.mark.parametrize("record", [None, "not json {", "[1, 2]"])
def test_lost_checksums_leave_checkpoints_unverifiable_not_trusted(two_steps, tmp_path, record):
  from transformers_jax.run_folder.checkpoints import CheckpointDamaged, Checkpoints

  folder = _copy(two_steps, tmp_path)
  path = folder / "checksums.json"
  path.unlink() if record is None else path.write_text(record)
  checkpoints = Checkpoints(folder, async_save=False)
  with pytest.raises(CheckpointDamaged, match="cannot be verified .* echo '{}' >"):
    checkpoints.restore_intact(None)
  checkpoints.close()  # closing does not record the unverified files as good
  assert (not path.exists()) if record is None else path.read_text() == record
  assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["2", "4"]  # nothing moved
  path.write_text("{}")  # the user's word that they are as saved
  checkpoints = Checkpoints(folder, async_save=False)
  assert checkpoints.restore_intact(None)[1] == 4
  checkpoints.close()


def test_a_folder_whose_checkpoints_were_all_set_aside_does_not_start_over(two_steps, tmp_path):
  """The start that finds every checkpoint damaged refuses; so does the next one, which finds
  only the set-aside folders (it began a second lineage from step 0 in the same run folder)."""
  from transformers_jax.run_folder.checkpoints import CheckpointDamaged, Checkpoints

  folder = _copy(two_steps, tmp_path)
  for step in (2, 4):
    (folder / str(step) / "default" / "manifest.ocdbt").unlink()
  for expected in (r"step\(s\) 4, 2 are damaged", r"set aside every one .*2.damaged, 4.damaged"):
    checkpoints = Checkpoints(folder, async_save=False)
    with pytest.raises(CheckpointDamaged, match=expected):
      checkpoints.restore_intact(None, on_damaged=lambda _: None)
    checkpoints.close()
  for aside in folder.glob("*.damaged"):  # the user's choice to start over
    import shutil

    shutil.rmtree(aside)
  checkpoints = Checkpoints(folder, async_save=False)
  assert checkpoints.restore_intact(None) == (None, None)
  checkpoints.close()


def test_init_from_takes_a_run_its_checkpoints_or_one_step_folder(two_steps, tmp_path, experiment):
  from transformers_jax.errors import UserError
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.train.resume import load_init_from

  folder = _copy(two_steps, tmp_path)  # RUN/checkpoints with steps 2 and 4
  Run(folder.parent).write_config(experiment("gpt2", "tiny"))
  for given, step in ((folder.parent, 4), (folder, 4), (folder / "2", 2)):
    params, loaded = load_init_from(str(given))
    assert loaded == step and float(params["w"][1]) == step
  with pytest.raises(UserError, match="no checkpoint found there: give a run's folder"):
    load_init_from(str(tmp_path / "elsewhere"))


def test_an_extra_file_in_a_checkpoint_is_not_damage(two_steps, tmp_path):
  from transformers_jax.run_folder.checkpoints import Checkpoints

  folder = _copy(two_steps, tmp_path)
  (folder / "4" / "notes.txt").write_text("saved before the long weekend")
  checkpoints = Checkpoints(folder, async_save=False)
  notes = []
  assert checkpoints.restore_intact(None, on_damaged=notes.append)[1] == 4 and not notes
  checkpoints.close()


@pytest.mark.parametrize(
    "text,needle",
    [
        ("{}", "has no 'model' object"),
        ('{"model": 5}', "has no 'model' object"),
        ("[]", "not a run config (a JSON object)"),
        ("", "is not valid JSON"),
        ('{"model_type": "gpt2", "n_embd": 8}', "Hugging Face model's config.json"),
    ],
)
def test_a_damaged_config_json_is_one_line_for_every_reader(tmp_path, text, needle):
  """generate and convert read config.json through Run.config (a KeyError or TypeError before),
  training through Run.saved_config: both name the file and the fix."""
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.errors import RunError

  (tmp_path / "config.json").write_text(text)
  for read in (Run(tmp_path).config, Run(tmp_path).saved_config):
    with pytest.raises(RunError, match=re.escape(needle)) as error:
      read()
    assert str(error.value).startswith(str(tmp_path / "config.json"))


def test_a_garbage_run_history_names_the_file(tmp_path):
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.errors import RunError

  (tmp_path / "run_history.jsonl").write_text('{"step": 2, "changes": {}}\n{"chan\n')
  with pytest.raises(RunError, match=r"run_history.jsonl: line 2 is not a recorded change"):
    Run(tmp_path).history()


# ----------------------------------------------------------------------------- 6. data changes
@pytest.mark.parametrize("size", [5_000_000, 12_000_000])
def test_a_corpus_rewritten_in_the_middle_gets_another_token_cache(tmp_path, size):
  import os

  from transformers_jax.data.token_cache import cache_key

  path = tmp_path / "corpus.txt"
  path.write_bytes(b"abcdefghij" * (size // 10))
  stat = path.stat()
  before = cache_key([path], ByteTokenizer(), "text")
  with open(path, "r+b") as f:  # 1 MB in the middle changed, same size, same times
    f.seek(size // 2 - 500_000)
    f.write(b"0123456789" * 100_000)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert path.stat().st_size == size
  assert cache_key([path], ByteTokenizer(), "text") != before
  with open(path, "ab") as f:
    f.write(b"more")
  assert cache_key([path], ByteTokenizer(), "text") != before


def test_a_resume_notices_changed_data_files_and_allows_harmless_settings(tmp_path):
  from transformers_jax.run_folder.checkpoints import Checkpoints
  from transformers_jax.config import load_config_module
  from transformers_jax.errors import UserError
  from transformers_jax.run_folder.runs import Run
  from transformers_jax.train.resume import check_resumed_settings
  from transformers_jax.train.entry import train

  corpus = tmp_path / "corpus.txt"
  corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 300)
  config = load_config_module(str(ROOT / "experiments" / "gpt2.py")).get_config("tiny")
  config.data.path, config.data.tokenize_workers = str(corpus), 1
  config.steps, config.batch_size, config.seq_len, config.eval_batches = 4, 2, 16, 1
  # a run stopped at step 2 that last read another version of the file: resuming it refuses
  # before anything compiles
  run = Run(tmp_path / "run")
  run.path.mkdir()
  run.write_config(config)
  (run.path / "run.json").write_text(json.dumps({"data_source": f"{corpus} (token cache old)"}))
  checkpoints = Checkpoints(run.checkpoint_dir, async_save=False)
  checkpoints.save(2, {"params": {"w": np.zeros(2)}, "opt_state": {"count": np.int32(2)}})
  checkpoints.close()
  with pytest.raises(UserError, match="with other data: the files at data.path changed"):
    train(config, str(run.path))
  # how batches are computed is not which: workers and prefetch may change on resume
  config.data.workers, config.data.prefetch = 2, 8
  changes = check_resumed_settings(run, config, allow_data_change=False)
  assert set(changes) == {"data.workers", "data.prefetch"}
  # the same file by another name (a link; a relative path likewise) is the same data, recorded
  (tmp_path / "link.txt").symlink_to(corpus)
  config.data.path = str(tmp_path / "link.txt")
  changes = check_resumed_settings(run, config, allow_data_change=False)
  assert changes["data.path"] == [str(corpus), str(tmp_path / "link.txt")]
  (tmp_path / "other.txt").write_text(corpus.read_text())  # a copy is another file: refused
  config.data.path = str(tmp_path / "other.txt")
  with pytest.raises(UserError, match=r"with other data: data.path"):
    check_resumed_settings(run, config, allow_data_change=False)
  config.data.path = str(corpus)
  config.data.tokenizer = str(tmp_path / "tokenizer.json")  # ids the model was not trained on
  with pytest.raises(UserError, match=r"with another tokenizer \(data.tokenizer 'byte' before"):
    check_resumed_settings(run, config, allow_data_change=True)
  config.data.tokenizer = "byte"
  config.population.seeds = 2  # a population resumed from a single run's state: which to pass
  with pytest.raises(
      UserError, match=r"holds a single run .*resume with --config.population.seeds=0"
  ):
    check_resumed_settings(run, config, allow_data_change=True)
  config.population.seeds = 0
  config.data.max_bytes += 1  # another setting of the data is another stream of examples
  with pytest.raises(UserError, match=r"data.max_bytes .*--allow_data_change"):
    check_resumed_settings(run, config, allow_data_change=False)


# ----------------------------------------------------------------------------- 7. HF folders
@pytest.mark.parametrize(
    "change, said",
    [
        ({"n_embd": "32"}, r"n_embd='32' gives model.d_model='32': must be an integer"),
        ({"n_embd": {}}, r"holds a value of the wrong type"),
        ({"n_layer": 1.5}, r"model.num_layers=1.5: must be an integer"),
        ([], r"holds a JSON list, not an object"),
        ({"vocab_size": 10**12}, r"model.vocab_size=1,000,000,000,000: token ids are int32"),
        ({"layer_norm_epsilon": float("nan")}, r"model.norm_eps=nan: must be a finite number"),
    ],
)
def test_hostile_hf_configs_are_one_line(tmp_path, change, said):
  import shutil

  from transformers_jax.interop import HFCheckpointError, load_hf

  shutil.copytree(FIXTURES / "gpt2", tmp_path / "m")
  config = json.loads((tmp_path / "m" / "config.json").read_text())
  config = config | change if isinstance(change, dict) else change
  (tmp_path / "m" / "config.json").write_text(json.dumps(config))
  with pytest.raises(HFCheckpointError, match=said):
    load_hf(tmp_path / "m")


def test_a_hugging_face_cache_snapshot_of_symlinks_loads(tmp_path):
  """models--org--name/snapshots/<revision>/ holds symlinks into ../../blobs/, as the hub's
  cache lays out a sharded model."""
  from safetensors.numpy import load_file, save_file

  from transformers_jax.interop import load_hf

  repo = tmp_path / "models--org--tiny"
  blobs, snapshot = repo / "blobs", repo / "snapshots" / "0123abc"
  blobs.mkdir(parents=True)
  snapshot.mkdir(parents=True)
  tensors = load_file(str(FIXTURES / "gpt2" / "model.safetensors"))
  names = sorted(tensors)
  halves = {
      "model-00001-of-00002.safetensors": names[::2],
      "model-00002-of-00002.safetensors": names[1::2],
  }
  files = {"config.json": (FIXTURES / "gpt2" / "config.json").read_bytes()}
  index = {"weight_map": {n: shard for shard, part in halves.items() for n in part}}
  files["model.safetensors.index.json"] = json.dumps(index).encode()
  for shard, part in halves.items():
    save_file({n: tensors[n] for n in part}, str(tmp_path / shard))
    files[shard] = (tmp_path / shard).read_bytes()
  for i, (name, data) in enumerate(files.items()):
    (blobs / f"blob{i}").write_bytes(data)
    (snapshot / name).symlink_to(f"../../blobs/blob{i}")
  want, _ = load_hf(FIXTURES / "gpt2")
  fields, params = load_hf(snapshot)
  assert fields == want and "decoder" in params


def test_converting_a_folder_without_a_tokenizer_says_what_generate_needs(tmp_path):

  out = run_python(
      ["-m", "transformers_jax.convert", "--from_hf", str(FIXTURES / "gpt2")]
      + ["--workdir", str(tmp_path / "run")]
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert "has no tokenizer.json" in out.stdout and "generate --prompt needs one" in out.stdout


# ----------------------------------------------------------------------------- 8. nonsense
def _gpt2_tiny():
  from transformers_jax.config import load_config_module

  return load_config_module(str(ROOT / "experiments" / "gpt2.py")).get_config("tiny")


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("population.learning_rates", "(1e-3, True)", r"True is not a number"),
        ("population.z_loss", "(0.0, 1e30)", r"z_loss weights are at most 1"),
        ("z_loss", 1e30, r"z_loss=1e\+30: must be at most 1"),
        ("profile.num_steps", 2, r"profile.start_step=300: the run has 200 steps"),
    ],
)
def test_nonsense_training_settings_are_refused_at_validation(field, value, said):
  from transformers_jax.config import ModelConfig
  from transformers_jax.train_config import validate

  config = _gpt2_tiny()
  config.profile.start_step = 300
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ValueError, match=said):
    validate(config, ModelConfig.from_dict(config.model), 1)


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("vocab_multiple", 1_000_000, r"vocab_multiple=1000000: at most 4096"),
        ("rope_theta", 0.0, r"rope_theta=0.0: RoPE's base wavelength must be positive"),
        ("rope_theta", -5.0, r"rope_theta=-5.0"),
    ],
)
def test_nonsense_model_settings_are_refused(field, value, said):
  from transformers_jax.config import ModelConfig

  with pytest.raises(ValueError, match=said):
    ModelConfig(**{field: value, "positions": "rope"})


@pytest.mark.parametrize("column", [[1, 2, 3], [["a"], ["b", "c"], []]])
def test_a_parquet_column_that_is_not_text_is_refused(tmp_path, column):
  import pyarrow as pa
  import pyarrow.parquet as pq

  from transformers_jax.data import DataError, sources

  pq.write_table(pa.table({"text": column}), tmp_path / "c.parquet")
  (unit,) = sources.plan_units([tmp_path / "c.parquet"])
  with pytest.raises(DataError, match=r"column 'text' holds (int64|list<\w+: string>), not text"):
    list(sources.read_unit(unit))


def test_compile_cache_off_in_any_case_is_off(tmp_path, monkeypatch):
  import jax

  from transformers_jax.machine import compile_cache

  monkeypatch.chdir(tmp_path)
  before = jax.config.jax_compilation_cache_dir
  try:
    assert compile_cache.enable("OFF") is None and compile_cache.enable("Off") is None
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
  assert not any(tmp_path.iterdir())  # no folder named OFF


@pytest.mark.parametrize("flag, said", [("--only=nosuchrow", "names no row"), ("--timeout=-5", "")])
def test_plan_scale_refuses_flags_that_select_nothing(tmp_path, flag, said):

  out = run_python(["scripts/plan_scale.py", flag, f"--out={tmp_path}"], timeout=120)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
  assert flag in lines[0]
  assert said in lines[0] and not any(tmp_path.iterdir())


def test_a_config_py_from_an_older_convert_names_the_line_to_change(tmp_path):
  from absl import flags

  from transformers_jax import cli

  old = tmp_path / "config.py"
  old.write_text(
      "import pathlib\n\n"
      f"{cli.OLD_CONVERTED_CONFIG}\n\n\n"
      "def get_config(arg=None):\n"
      "  return config_from_json(pathlib.Path(__file__).with_name('config.json'))\n"
  )
  flag_values = flags.FlagValues()
  cli.define_config_flag(flag_values=flag_values)
  _, message = cli._parse(flag_values, ["train", f"--config={old}"])
  assert "older convert" in message
  assert "from transformers_jax.train_config import config_from_json" in message
