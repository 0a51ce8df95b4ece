"""Several slices joined by the data-center network (mesh.num_slices, dcn_data, dcn_fsdp):
simulated slices of 8 CPU devices train as one slice does, and a multi-slice TPU compile says
which collectives cross slices."""

import pytest

from transformers_jax.machine import parallel
from transformers_jax.train import compile as compile_step

from conftest import run_worker


def test_two_simulated_slices_train_as_one_slice():
  meshes = {
      "one_slice": {"data": 2, "fsdp": 4},
      "data_across_slices": {"num_slices": 2, "data": 1, "fsdp": 4, "dcn_data": 2},
      "fsdp_across_slices": {"num_slices": 2, "data": 2, "fsdp": 2, "dcn_data": 1, "dcn_fsdp": 2},
  }
  out = run_worker(
      "sharding_worker.py", {"families": ["gpt2"], "meshes": meshes, "steps": 3}, devices=8
  )
  reference = out["gpt2/one_slice"]["losses"]
  for name in ("data_across_slices", "fsdp_across_slices"):
    assert out[f"gpt2/{name}"]["losses"] == pytest.approx(reference, rel=1e-5), name
  # fsdp over 2 slices x 2 chips shards the weights 4 ways, as fsdp 4 in one slice does
  assert out["gpt2/fsdp_across_slices"]["shards"] == out["gpt2/one_slice"]["shards"]


@pytest.fixture(scope="module")
def two_slice_reports(experiment):
  reports = {}
  for name, dcn in (("data", {"dcn_data": 2}), ("fsdp", {"dcn_data": 1, "dcn_fsdp": 2})):
    config = experiment("gpt2", "tiny")
    config.model.num_layers = 1
    config.mesh.update(topology="v5e:2x2", num_slices=2, data=1, fsdp=4, **dcn)
    reports[name] = compile_step.report(config, verbose=False)
  return reports


def test_a_two_slice_compile_reports_the_collectives_that_cross_slices(two_slice_reports):
  data = two_slice_reports["data"]
  assert (data["num_slices"], data["chips"], data["mesh"]["data"]) == (2, 8, 2)
  # data parallel across slices: only the gradients' (and metrics') all-reduce crosses DCN
  assert set(data["dcn_collectives"]) == {"ALL_REDUCE"}
  # parameters sharded across slices: their all-gathers cross DCN too
  assert "ALL_GATHER" in two_slice_reports["fsdp"]["dcn_collectives"]


def test_slice_settings_are_refused_in_one_line():
  for axes, said in (
      ({"num_slices": 3, "data": -1}, "divide the 8 devices"),
      ({"num_slices": 2, "dcn_data": 1, "dcn_fsdp": 1}, "must equal mesh.num_slices=2"),
      ({"num_slices": 2, "dcn_data": -1, "dcn_fsdp": -1}, "-1 \\(the rest\\) for one axis"),
  ):
    with pytest.raises(ValueError, match=said):
      parallel.make_mesh(axes, [object()] * 8)
