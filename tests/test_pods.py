"""Runs as they go on pods and clusters: MFU over every process's devices, sampling and BLEU with
parameters split across processes, per-process batch rows, a failed cluster join, SIGTERM,
damaged checkpoints, one run per workdir, resumed settings, profiling, the compile cache and
run.json."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from transformers_jax.machine import compile_cache
from transformers_jax.machine.local_cluster import free_port
from transformers_jax.errors import UserError
from transformers_jax.errors import RunError
from transformers_jax.run_folder.runs import Run
from transformers_jax.run_folder.checkpoints import Checkpoints, non_finite_values
from transformers_jax.train import events, metrics
from transformers_jax.train.entry import train

from conftest import ROOT, run_python, start_python, start_python_cluster
from test_train import assert_one_line_error, configure, losses, run_cli

GPT2_TINY = str(ROOT / "experiments/gpt2.py") + ":tiny"
# The one-process runs train gpt2:tiny with one block: locks, signals, checkpoints and resumes do
# not depend on depth, and each compile costs less.
ONE_BLOCK = dict(num_layers=1)


# ----------------------------------------------------------------------------- MFU
def fake_devices(kind, platform, per_process, processes=2):
  return [
      types.SimpleNamespace(device_kind=kind, platform=platform, process_index=p)
      for p in range(processes)
      for _ in range(per_process)
  ]


def test_mfu_peak_counts_the_devices_of_every_process(monkeypatch):
  peak, source = metrics.device_peak(fake_devices("TPU v5", "tpu", 4))
  assert peak == pytest.approx(8 * 459e12) and "TPU v5p" in source and "x 8" in source
  peak, _ = metrics.device_peak(fake_devices("NVIDIA H100 80GB HBM3", "gpu", 8, processes=4))
  assert peak == pytest.approx(32 * 989e12)
  # a CPU: the measured rate of one host, times the hosts
  monkeypatch.setattr(metrics, "measured_cpu_peak", lambda: 100.0)
  assert metrics.device_peak(fake_devices("cpu", "cpu", 4), cpu_hosts=2)[0] == 200.0
  assert metrics.device_peak(fake_devices("cpu", "cpu", 4), cpu_hosts=1)[0] == 100.0
  assert metrics.device_peak(fake_devices("TPU v5", "tpu", 4), per_device_override=5.0)[0] == 40.0
  assert metrics.device_peak(fake_devices("TPU v9", "tpu", 4))[0] is None


# ----------------------------------------------------------------------------- two processes
@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
  out = tmp_path_factory.mktemp("two")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = start_python_cluster(
      lambda i, address: [str(ROOT / "tests/pods_worker.py"), address, str(i), str(out)],
      2,
      env=env,
      stderr_to_stdout=True,
  )
  try:
    logs = [p.communicate(timeout=480)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert all(p.returncode == 0 for p in procs), logs[0][-3000:] + logs[1][-3000:]
  results = [json.loads((out / f"result_{i}.json").read_text()) for i in range(2)]
  return out, results, logs


def test_each_process_reads_only_its_own_rows(two_processes):
  out, _, _ = two_processes
  rows = [np.load(out / f"rows_{i}.npy") for i in range(2)]
  whole = np.load(out / "global.npy")
  assert len(rows[0]) == len(rows[1]) == len(whole) // 2
  assert {r.tobytes() for r in rows[0]}.isdisjoint(r.tobytes() for r in rows[1])
  np.testing.assert_array_equal(np.concatenate(rows), whole)


def test_sigterm_to_one_process_stops_every_process_at_the_same_step(two_processes):
  out, results, _ = two_processes
  said = [r["interrupted"] for r in results]
  assert said[0] and said[0] == said[1] and "SIGTERM" in said[0], said
  step = int(said[0].split("saved step ")[1].split()[0])
  assert step >= 2  # process 1 was signalled during step 2; both ran on to the agreed step
  logged = losses(out / "lm")
  assert sorted(logged) == list(range(1, 9))  # resumed after the saved step, nothing repeated
  assert [r["lm_step"] for r in results] == [8, 8]


def test_sample_and_bleu_with_parameters_split_across_processes(two_processes):
  out, results, _ = two_processes
  assert results[0]["devices"] == 4
  sample = (out / "lm" / "sample.txt").read_text()
  assert sample.startswith("def ") and sample == results[0]["sample"]
  bleu = [r["eval_bleu"] for r in results]
  assert bleu[0] is not None and bleu[0] == bleu[1] and 0.0 <= bleu[0] <= 100.0
  assert json.loads((out / "lm" / "run.json").read_text())["process_count"] == 2


def test_a_population_member_equals_its_solo_run_across_processes(two_processes):
  """Members laid out like the solo model (fsdp over both processes' devices): member 0 of the
  population logs the losses of the LM run it repeats."""
  out, results, _ = two_processes
  assert [r["population_step"] for r in results] == [8, 8]
  lines = [json.loads(x) for x in (out / "population" / "metrics.jsonl").read_text().splitlines()]
  member = {x["step"]: x["loss"] for x in lines if x.get("member") == 0 and "loss" in x}
  solo = losses(out / "lm")
  assert sorted(member) == sorted(solo) == list(range(1, 9))
  np.testing.assert_allclose([member[s] for s in solo], list(solo.values()), rtol=1e-5)


# ----------------------------------------------------------------------------- cluster join
def test_a_failed_cluster_join_is_one_line(tmp_path):
  out = run_cli(
      "--config",
      GPT2_TINY,
      "--workdir",
      str(tmp_path / "unused"),
      f"--coordinator_address=localhost:{free_port()}",
      "--num_processes=2",
      "--process_id=1",
      "--join_timeout_s=2",
  )
  assert_one_line_error(out, "process 1 of 2 could not join", "--coordinator_address")
  assert out.returncode == 2


# ----------------------------------------------------------------------------- one process
def cli_cmd(workdir, *extra):
  return [
      "-m",
      "transformers_jax.train",
      "--config",
      GPT2_TINY,
      "--workdir",
      str(workdir),
      "--config.steps=1000",
      "--config.log_every=1",
      "--config.eval_every=0",
      "--config.checkpoint_every=0",
      "--config.sample.max_new_tokens=0",
      "--config.data.max_bytes=200000",
      "--config.model.num_layers=1",  # ONE_BLOCK
      "--config.device_peak_flops=1e12",  # no CPU peak measured at start: MFU is not read here
      *extra,
  ]


@pytest.fixture(scope="module")
def terminated(tmp_path_factory):
  """A run stopped by SIGTERM, and a second run tried on its workdir while it was going."""
  work = tmp_path_factory.mktemp("term") / "w"
  cache = work.parent / "compile_cache"
  first = start_python(
      cli_cmd(work, f"--compile_cache_dir={cache}"),
      # every program it compiles goes to the cache, however quickly it compiled
      env=dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"),
  )
  try:
    # running: its steps are being logged ("step 2/1000: loss ...")
    assert first.wait_for_line(lambda line: line.startswith("step 2/"), timeout=300)
    second = run_python(cli_cmd(work), timeout=300)
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=300)
  finally:
    first.kill()
  return work, cache, first, stderr, second


def test_sigterm_saves_a_checkpoint_and_exits_like_ctrl_c(terminated):
  work, _, first, stderr, _ = terminated
  assert first.returncode == 75, stderr[-2000:]  # saved and stopped: rerun to resume
  line = stderr.strip().splitlines()[-1]
  assert line.startswith("error: interrupted (SIGTERM): saved step "), line
  step = int(line.split("saved step ")[1].split()[0])
  assert Checkpoints(work / "checkpoints").latest_step() == step >= 2
  assert not (work / ".lock").exists()  # released on the way out


def test_a_second_run_on_a_busy_workdir_stops_naming_the_first(terminated):
  _, _, first, _, second = terminated
  assert_one_line_error(second, "in use by another run", f"pid {first.pid}", socket.gethostname())
  assert second.returncode == 2


def test_the_compile_cache_goes_where_it_is_told(terminated, monkeypatch):
  _, cache, _, _, _ = terminated
  assert any(cache.iterdir())  # the first run's compiled programs
  monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
  assert compile_cache.default_dir() == pathlib.Path("/somewhere/transformers_jax/jax")
  before = jax.config.jax_compilation_cache_dir
  try:
    assert compile_cache.enable("") == before  # the environment's (this suite's own) is kept
    assert compile_cache.enable(compile_cache.OFF) is None
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def dead_pid() -> int:
  gone = subprocess.Popen([sys.executable, "-c", "pass"])
  gone.wait()
  return gone.pid


def test_resume_takes_over_a_dead_lock_records_changes_and_profiles(terminated, capsys, tmp_path):
  work = tmp_path / "w"
  shutil.copytree(terminated[0], work)
  step = Checkpoints(work / "checkpoints").latest_step()
  (work / ".lock").write_text(
      json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "started": "earlier"})
  )
  saved = json.loads((work / "config.json").read_text())
  fields = dict(
      steps=1000,
      eval_every=0,
      checkpoint_every=0,
      data=dict(max_bytes=200_000),
      log_every=1,
      model=ONE_BLOCK,
  )
  # the seed or the data may not change silently
  with pytest.raises(UserError, match=r"seed \(0 before, 1 now\).*--allow_data_change"):
    train(configure(experiment_cfg(), "gpt2", "tiny", seed=1, **fields), work)
  config = configure(
      experiment_cfg(),
      "gpt2",
      "tiny",
      learning_rate=5e-4,
      stop_after=step + 2,
      profile=dict(start_step=step, num_steps=1),
      **fields,
  )
  result = train(config, work)
  printed = capsys.readouterr().out
  assert "took over the lock of a run that is gone" in printed
  assert "learning_rate: 0.003 -> 0.0005" in printed and result["step"] == step + 2
  (entry,) = [json.loads(x) for x in (work / "run_history.jsonl").read_text().splitlines()]
  assert entry["resumed_at_step"] == step
  assert entry["changes"]["learning_rate"] == [3e-3, 5e-4]
  assert "stop_after" in entry["changes"]
  assert json.loads((work / "config.json").read_text()) == saved  # still the run's start
  # the same settings again: nothing new to record
  train(config, work)
  assert len((work / "run_history.jsonl").read_text().splitlines()) == 1
  traces = list((work / "tb" / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert traces and traces[0].stat().st_size > 0
  info = json.loads((work / "run.json").read_text())
  assert info["process_count"] == 1 and info["device_count"] == jax.device_count()
  assert info["packages"]["jax"] == jax.__version__ and info["argv"]
  assert not (work / ".lock").exists()


def experiment_cfg():
  from conftest import ROOT as root
  from transformers_jax.config import load_config_module

  return lambda file, preset: load_config_module(
      str(root / "experiments" / f"{file}.py")
  ).get_config(preset)


# ----------------------------------------------------------------------------- damaged checkpoints
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
  """gpt2:tiny trained 4 steps with checkpoints at 2 and 4."""
  work = tmp_path_factory.mktemp("ckpt") / "w"
  train(configure(experiment_cfg(), "gpt2", "tiny", **CKPT_RUN, steps=4), work)
  return work


CKPT_RUN = dict(checkpoint_every=2, log_every=1, data=dict(max_bytes=200_000), model=ONE_BLOCK)


def data_file(step_dir: pathlib.Path) -> pathlib.Path:
  return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_a_flipped_bit_falls_back_to_the_intact_checkpoint(two_checkpoints, tmp_path, capsys):
  work = tmp_path / "w"
  shutil.copytree(two_checkpoints, work)
  target = data_file(work / "checkpoints" / "4")
  raw = bytearray(target.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  target.write_bytes(bytes(raw))
  (work / "metrics.jsonl").unlink()
  train(configure(experiment_cfg(), "gpt2", "tiny", **CKPT_RUN, steps=4), work)
  printed = capsys.readouterr().out
  assert "checkpoint step 4" in printed and "is damaged" in printed and "4.damaged" in printed
  assert "resumed from step 2" in printed
  assert (work / "checkpoints" / "4.damaged").is_dir()
  want = losses(two_checkpoints)
  assert losses(work) == {s: want[s] for s in (3, 4)}  # the same run as the uninterrupted one


def test_non_finite_state_is_damaged_and_none_intact_is_one_line(two_checkpoints, tmp_path):
  work = tmp_path / "w"
  shutil.copytree(two_checkpoints, work)
  checkpoints = Checkpoints(work / "checkpoints", async_save=False)
  state = jax.tree_util.tree_map(np.array, checkpoints.restore(4, None))
  first = jax.tree_util.tree_leaves(state["opt_state"])
  leaf = next(x for x in first if np.issubdtype(x.dtype, np.floating) and x.size > 1)
  leaf[...] = np.nan  # a restored tree of numpy arrays: written in place
  checkpoints.close()
  shutil.rmtree(work / "checkpoints" / "4")
  checkpoints = Checkpoints(work / "checkpoints", async_save=False)
  checkpoints.save(4, state)  # checksums match: only the finite check can tell
  checkpoints.close()
  data_file(work / "checkpoints" / "2").write_bytes(b"")  # and step 2 truncated
  out = run_cli(
      "--config",
      GPT2_TINY,
      "--workdir",
      str(work),
      "--config.steps=6",
      "--config.checkpoint_every=2",
      "--config.data.max_bytes=200000",
      "--config.model.num_layers=1",
  )
  assert_one_line_error(out, "no intact checkpoint", "4, 2")
  assert out.returncode == 2
  assert (
      "non-finite values in opt_state" in out.stdout and "differs from its checksum" in out.stdout
  )


def flip_a_byte(step_dir: pathlib.Path) -> None:
  target = data_file(step_dir)
  raw = bytearray(target.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  target.write_bytes(bytes(raw))


def test_loading_parameters_verifies_checkpoints_like_a_resume(two_checkpoints, tmp_path):
  """generate, convert and init_from load through Run.load_params: a damaged checkpoint falls
  back to the newest intact one with a note, a damaged --step or none intact is one error."""
  work = tmp_path / "w"
  shutil.copytree(two_checkpoints, work)
  flip_a_byte(work / "checkpoints" / "4")
  run = Run(work)
  with pytest.raises(RunError, match="--step=4: checkpoint step 4 .* is damaged .*differs"):
    run.load_params(4)
  assert (work / "checkpoints" / "4").is_dir()  # a given step is refused, not moved
  notes = []
  params, step = run.load_params(on_damaged=notes.append)
  assert step == 2 and len(notes) == 1 and "step 4" in notes[0] and "4.damaged" in notes[0]
  want, _ = Run(two_checkpoints).load_params(2)
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, params, want))
  flip_a_byte(work / "checkpoints" / "2")
  out = run_python(
      [
          "-m",
          "transformers_jax.generate",
          "--workdir",
          str(work),
          "--prompt=a",
          "--max_new_tokens=2",
      ]
  )
  assert_one_line_error(out, "no intact checkpoint", "2")
  assert out.returncode == 2 and "checkpoint step 2" in out.stdout
  tree = {"a": {"b": np.array([1.0, np.nan]), "c": np.zeros(2, np.int32)}, "d": [np.ones(2)]}
  assert non_finite_values(tree) == "non-finite values in a/b"
  assert non_finite_values({"d": [np.ones(2)]}) is None


def test_the_nan_guard_names_non_finite_inputs_or_the_learning_rate():
  ckpt = types.SimpleNamespace(wait=lambda: None, directory="ckpt")
  nan = {"loss": float("nan"), "grad_norm": float("nan")}
  with pytest.raises(events.TrainingDiverged, match="step 3 holds non-finite values in images"):
    events.stop_if_not_finite((3, nan, {"images": np.array([0.0, np.inf])}), ckpt, 2)
  with pytest.raises(events.TrainingDiverged, match="learning rate is too high"):
    events.stop_if_not_finite((3, nan, {"tokens": np.array([1, 2])}), ckpt, 2)
