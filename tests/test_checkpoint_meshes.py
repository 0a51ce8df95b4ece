"""A checkpoint written on a mesh of several devices is read on one: generate, convert --to_hf
and init_from restore onto the devices they have (Checkpoints.restore), whatever mesh, device
count or process count wrote it. Training's own resume on another mesh is test_parallel.py's."""

import pytest

from conftest import param_digest, run_worker
from transformers_jax.convert import export_hf
from transformers_jax.interop import load_hf

RUNS = ("fsdp", "context", "expert", "population")


@pytest.fixture(scope="module")
def read_back(tmp_path_factory):
  """(what each tiny run gives read where it was trained, on two devices; the same read on
  one device; the runs' folder): crossmesh_worker.py trains fsdp 2, context 2, expert 2 and
  a population over fsdp 2."""
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
  for run, member in (("fsdp", None), ("context", None), ("population", 1)):
    target = tmp_path / run
    assert export_hf(out / run, target, member=member) == "GPT2LMHeadModel"
    _, params = load_hf(target)
    assert param_digest(params) == trained[run]["params"], run
