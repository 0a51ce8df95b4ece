"""Weights & Biases, offline (no network): the run's W&B history, read back from W&B's own run
files with wandb's reader, equals metrics.jsonl step for step; a resume continues the same W&B
run; a population logs each member under member_<i>/; without wandb, one error line."""

import json
import os
import pathlib
import sys
import time

import pytest

from transformers_jax.errors import UserError
from transformers_jax.train import trackers
from transformers_jax.train.entry import train
from transformers_jax.train.metrics import scalars

# W&B's own bookkeeping in every history row, beside the logged values
WANDB_KEYS = ("_step", "_timestamp", "_runtime")


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
  """W&B in offline mode with its files in a temporary folder; the environment restored."""
  folder = tmp_path_factory.mktemp("wandb_dir")
  saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_DIR", "WANDB_SILENT")}
  os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(folder), WANDB_SILENT="true")
  yield folder
  for key, value in saved.items():
    if value is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = value


def tiny_config(experiment, **fields):
  config = experiment("gpt2", "tiny")
  config.unlock()
  config.model.update(num_layers=1, d_model=16, num_heads=2, max_len=32)
  config.update(
      dict(
          steps=4,
          batch_size=4,
          seq_len=16,
          warmup_steps=1,
          log_every=1,
          eval_every=2,
          eval_batches=1,
          checkpoint_every=2,
          device_peak_flops=1e9,  # a made-up peak: no CPU matmul measured for MFU
      )
  )
  config.data.max_bytes = 50_000
  config.sample.max_new_tokens = 0
  config.wandb.update(project="transformers-jax-tests", tags="tiny,offline")
  config.update(fields)
  return config


def offline_runs(folder: pathlib.Path, timeout_s: float = 60.0) -> list[dict]:
  """Each offline run's records under `folder`, oldest first, read with wandb's own reader of
  its run files: {"id", "config", "rows": history rows, "files": saved paths, "exit"}. A run
  whose exit record is not there yet is read again: wandb-core writes the file's last records
  a moment after finish() returns (at the latest when the process exits)."""
  deadline = time.monotonic() + timeout_s
  while True:
    runs = [read_run(path) for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))]
    if all(run["exit"] is not None for run in runs) or time.monotonic() > deadline:
      return runs  # (the offline-run-<start time>-<id> folders sort oldest first)
    time.sleep(0.2)


def read_run(path: pathlib.Path) -> dict:
  """One offline run file's records, read with wandb's own reader (wandb.sdk.internal); a
  record still being written ends the reading there (no exit record yet)."""
  from wandb.proto import wandb_internal_pb2
  from wandb.sdk.internal import datastore

  store = datastore.DataStore()
  store.open_for_scan(str(path))
  run = {"rows": [], "files": [], "exit": None}
  while True:
    try:
      data = store.scan_data()
    except AssertionError:  # a torn last record
      data = None
    if data is None:
      return run
    record = wandb_internal_pb2.Record()
    record.ParseFromString(data)
    kind = record.WhichOneof("record_type")
    if kind == "run":
      run["id"] = record.run.run_id
      run["config"] = {i.key: json.loads(i.value_json) for i in record.run.config.update}
    elif kind == "history":
      items = record.history.item
      run["rows"].append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in items})
    elif kind == "files":
      run["files"] += [f.path for f in record.files.files]
    elif kind == "exit":
      run["exit"] = record.exit.exit_code


def expected_rows(workdir: pathlib.Path, prefix=lambda line: "") -> list[dict]:
  """metrics.jsonl as W&B rows: the lines of one step merged, named as the trackers name them."""
  rows = {}
  for text in (workdir / "metrics.jsonl").read_text().splitlines():
    line = json.loads(text)
    step = line.pop("step")
    rows.setdefault(step, {"_step": step}).update(scalars(line, prefix(line)))
  return [rows[step] for step in sorted(rows)]


@pytest.fixture(scope="module")
def resumed_run(offline, experiment, tmp_path_factory):
  """A tiny GPT trained 2 of 4 steps, then resumed to the end, logging to W&B offline."""
  workdir = tmp_path_factory.mktemp("wandb_run")
  train(tiny_config(experiment, stop_after=2), str(workdir))
  train(tiny_config(experiment), str(workdir))
  return workdir, offline_runs(offline)


def test_offline_history_equals_metrics_jsonl_and_a_resume_continues_the_run(resumed_run):
  workdir, runs = resumed_run
  assert len(runs) == 2  # one offline run file per invocation
  run_id = json.loads((workdir / "wandb_run.json").read_text())["id"]
  assert [r["id"] for r in runs] == [run_id, run_id]  # the resume continued the same W&B run
  assert [r["exit"] for r in runs] == [0, 0]
  logged = [
      {k: v for k, v in row.items() if k not in WANDB_KEYS[1:]} for r in runs for row in r["rows"]
  ]
  expected = expected_rows(workdir)
  assert [row["_step"] for row in logged] == [1, 2, 3, 4]  # the second run starts at step 3
  assert logged == expected
  assert "eval_loss" in logged[1] and "residual_rms/decoder/layer_0" in logged[1]
  # the resolved config, and the run's files
  config = runs[1]["config"]
  assert config["steps"] == 4 and config["model"]["d_model"] == 16
  assert config["stop_after"] == 0 and runs[0]["config"]["stop_after"] == 2
  assert {"config.json", "run.json", "metrics.jsonl"} <= set(runs[0]["files"])
  assert "run_history.jsonl" in runs[1]["files"]  # the resume's recorded change (stop_after)


def test_a_population_logs_each_member_under_its_prefix(offline, experiment, tmp_path):
  """The population's writer (what train_population writes), read back: one W&B row per step
  with every member's values under member_<i>/, and the member table in the config."""
  before = len(offline_runs(offline))
  config = tiny_config(experiment)
  table = [{"seed": 0, "learning_rate": 1e-3}, {"seed": 0, "learning_rate": 3e-3}]
  writer = trackers.open_writer(config, tmp_path, enabled=True, members=table)
  for step in (1, 2):
    for i, member in enumerate(table):
      line = {**member, "loss": 2.0 / step + i, "diverged": False}
      writer.write(step, line, tb_prefix=f"member_{i:03d}/")
  writer.write(
      2, {**table[1], "eval_loss": float("nan"), "residual_rms": {"decoder": [0.5]}}, "member_001/"
  )
  writer.close()
  (run,) = offline_runs(offline)[before:]
  member_of = lambda line: f"member_{table.index({k: line[k] for k in table[0]}):03d}/"  # noqa: E731
  logged = [{k: v for k, v in row.items() if k not in WANDB_KEYS[1:]} for row in run["rows"]]
  # W&B writes NaN as NaN; compare it apart (NaN != NaN)
  nan = logged[1].pop("member_001/eval_loss")
  expected = expected_rows(tmp_path, member_of)
  assert nan != nan and expected[1].pop("member_001/eval_loss") != nan
  assert logged == expected
  assert (
      logged[0]["member_001/loss"] == 3.0
      and logged[1]["member_001/residual_rms/decoder/layer_0"] == 0.5
  )
  assert run["config"]["population_members"] == table


def test_without_wandb_one_line_names_the_extra(experiment, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
  with pytest.raises(
      UserError, match=r'wandb package is not installed: pip install -e "\.\[wandb\]"'
  ):
    trackers.check(tiny_config(experiment))
  config = tiny_config(experiment)
  config.wandb.project = ""
  trackers.check(config)  # not asked for: no wandb needed
