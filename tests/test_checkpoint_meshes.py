"""A checkpoint written on a mesh of several devices is read on one: generate, convert --to_hf
and init_from restore onto the devices they have (Checkpoints.restore), whatever mesh, device
count or process count wrote it (training's own resume on another mesh is test_parallel.py's).
A resume may change how the model is computed, scanned or looped blocks included."""

import shutil

import jax
import numpy as np
import pytest

from conftest import param_digest, run_worker
from transformers_jax.convert import export_hf
from transformers_jax.interop import load_hf
from transformers_jax.modules.block import loop_to_scan, scan_to_loop, stacked_blocks
from transformers_jax.run_folder.runs import Run, load_run
from transformers_jax.run_folder.checkpoints import Checkpoints
from transformers_jax.train.entry import train
from transformers_jax.train.setup import Setup
from transformers_jax.train_config import config_from_json

RUNS = ("fsdp", "context", "expert", "population", "stage")


@pytest.fixture(scope="module")
def read_back(tmp_path_factory):
  """(what each tiny run gives read where it was trained, on two devices; the same read on
  one device; the runs' folder): crossmesh_worker.py trains fsdp 2, context 2, expert 2,
  a population over fsdp 2 and two pipeline stages."""
  out = tmp_path_factory.mktemp("meshes")
  trained = run_worker("crossmesh_worker.py", {"mode": "train", "out": str(out)}, devices=2)
  read = run_worker("crossmesh_worker.py", {"mode": "read", "out": str(out)}, devices=1)
  assert (trained["devices"], read["devices"]) == (2, 1)
  return trained, read, out


@pytest.mark.parametrize("run", RUNS)
def test_generate_on_one_device_prints_what_it_prints_on_the_training_mesh(read_back, run):
  trained, read, _ = read_back
  assert read[run]["generate"] == trained[run]["generate"]
  assert len(set(trained[run]["generate"].split(","))) > 1  # a greedy output that says something
  assert read[run]["params"] == trained[run]["params"]


@pytest.mark.parametrize("run", RUNS)
def test_init_from_on_one_device_takes_every_tensor(read_back, run):
  trained, read, _ = read_back
  assert read[run]["init_from"] == trained[run]["params"]
  assert "0 new: -" in read[run]["init_note"]


def test_convert_to_hf_on_one_device_exports_the_trained_parameters(read_back, tmp_path):
  trained, _, out = read_back
  for run, member in (("fsdp", None), ("context", None), ("population", 1), ("stage", None)):
    target = tmp_path / run
    assert export_hf(out / run, target, member=member) == "GPT2LMHeadModel"
    _, params = load_hf(target)  # blocks looped, as Hugging Face numbers them
    assert (
        param_digest(loop_to_scan(params) if run == "stage" else params) == trained[run]["params"]
    ), run


def test_a_resume_may_change_how_the_model_is_computed(read_back, tmp_path, capsys):
  """The fsdp run resumed on one device with another attention implementation, remat and
  scanned blocks: the same parameters, so it resumes (no 'different model'), says so and
  records it; its checkpoint's blocks are then stacked, and readers get config.json's layout."""
  _, _, out = read_back
  work = tmp_path / "fsdp"
  shutil.copytree(out / "fsdp", work)
  config = config_from_json(work / "config.json")
  config.steps, config.mesh.fsdp = 2, 1
  changed = dict(attention_impl="einsum", attention_query_blocks=2, remat="full", scan_layers=True)
  config.model.update(changed)
  train(config, work)
  printed = capsys.readouterr().out
  assert "resumed from step 1" in printed and "model.scan_layers: False -> True" in printed
  (entry,) = Run(work).history()
  was = dict(attention_impl="auto", attention_query_blocks=4, remat="none", scan_layers=False)
  assert {f: entry["changes"][f"model.{f}"] for f in changed} == {
      f: [was[f], changed[f]] for f in changed
  }
  stored = Checkpoints(work / "checkpoints").restore(2, None)["params"]
  _, params, _, step = load_run(work)
  assert step == 2 and "layers" in stored["decoder"] and "layer_0" in params["decoder"]
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, scan_to_loop(stored))


def test_a_population_state_moves_between_scanned_and_looped_blocks(experiment):
  """A resume that changes model.scan_layers restores the checkpoint in its own layout and
  moves the blocks (Setup.in_model_layout): every tensor of every member, optimizer state
  included, lands at its place in the other layout, and back again."""
  config = experiment("gpt2", "tiny")
  config.population.learning_rates = "(1e-3, 3e-3)"
  looped_setup = Setup(config)
  config.model.scan_layers = True
  scanned_setup = Setup(config)
  rng = np.random.default_rng(0)
  looped = jax.tree_util.tree_map(
      lambda x: rng.standard_normal(x.shape).astype(x.dtype), looped_setup.abstract_state()
  )
  scanned = scanned_setup.in_model_layout(looped)
  assert (stacked_blocks(looped.params), stacked_blocks(scanned.params)) == (False, True)
  member = lambda tree, m: jax.tree_util.tree_map(lambda x: np.asarray(x)[m], tree)  # noqa: E731
  for m in range(2):  # each member's blocks, in the other layout
    for got, want in ((scanned.params, looped.params), (scanned.opt_state, looped.opt_state)):
      jax.tree_util.tree_map(
          np.testing.assert_array_equal,
          jax.tree_util.tree_map(
              scan_to_loop, member(got, m), is_leaf=lambda x: isinstance(x, dict)
          ),
          member(want, m),
      )
  back = looped_setup.in_model_layout(scanned)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, looped)
