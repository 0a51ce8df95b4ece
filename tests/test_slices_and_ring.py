"""Several slices joined by the data-center network (mesh.num_slices, dcn_data, dcn_fsdp) and
ring attention over the context axis (model.context_strategy=ring): simulated slices of 8 CPU
devices and context-split sequences train as whole sequences in one slice do, and a
multi-slice TPU compile says which collectives cross slices."""

import pytest

from transformers_jax.machine import parallel
from transformers_jax.train import compile as compile_step

from conftest import run_worker


@pytest.fixture(scope="module")
def mesh_runs():
  """One 8-device worker, 5 steps on the same batches: GPT-2 with whole sequences in one slice,
  over two simulated slices (data or fsdp across them) and split over context 4 with ring
  attention (model.context_strategy=ring: read only where context > 1); BERT whole and ring.
  One block per stack: slices split every block's weights and batches alike, and the ring runs
  in every block alike."""
  meshes = {
      "one_slice": {"data": 8},
      "data_across_slices": {"num_slices": 2, "data": 1, "fsdp": 4, "dcn_data": 2},
      "fsdp_across_slices": {"num_slices": 2, "data": 2, "fsdp": 2, "dcn_data": 1, "dcn_fsdp": 2},
      "ring4": {"fsdp": 2, "context": 4},
  }
  spec = {
      "runs": {"gpt2": list(meshes), "bert": ["one_slice", "ring4"]},
      "meshes": meshes,
      "steps": 5,
      "batch_size": 8,
      "model": {"context_strategy": "ring", "attention_impl": "einsum", "num_layers": 1},
  }
  return run_worker("sharding_worker.py", spec, devices=8)


def test_two_simulated_slices_train_as_one_slice(mesh_runs):
  reference = mesh_runs["gpt2/one_slice"]["losses"]
  for name in ("data_across_slices", "fsdp_across_slices"):
    assert mesh_runs[f"gpt2/{name}"]["losses"] == pytest.approx(reference, rel=1e-5), name


def test_fsdp_across_slices_shards_the_weights_over_both(mesh_runs):
  # fsdp over 2 slices x 2 chips shards the weights 4 ways, as fsdp 4 in one slice would
  shards = mesh_runs["gpt2/fsdp_across_slices"]["shards"]
  one = mesh_runs["gpt2/one_slice"]["shards"]
  assert shards.keys() == one.keys()
  for name, (shape, shard) in shards.items():
    if name.endswith(("wi/kernel", "token_embed/embedding")):
      assert shard[0] * 4 == shape[0] or shard[-1] * 4 == shape[-1], (name, shape, shard)


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_ring_attention_over_context_4_equals_whole_sequences(mesh_runs, family):
  """Causal (zig-zag balanced) and bidirectional (with its padding mask)."""
  whole = mesh_runs[f"{family}/one_slice"]["losses"]
  assert mesh_runs[f"{family}/ring4"]["losses"] == pytest.approx(whole, rel=1e-5)


def test_ring_attention_value_and_gradients_equal_whole_sequence_flash():
  """Blockwise ring steps and the second trip around the ring for the gradients: queries, keys,
  values and a learned T5 bias, causal by shuffled true positions with packed documents, and
  bidirectional with padded keys (tests/ring_worker.py, 4 simulated devices, 12 tokens each
  in blocks of 8)."""
  result = run_worker("ring_worker.py", devices=4)
  for case, by_name in result["errors"].items():
    for name, error in by_name.items():
      assert error <= 1e-5, (case, name, error)
  # a query with no key to attend averages values of 1 (with padding: 12 of 16 slots), once
  assert result["lonely_output"] <= 1.0 + 1e-6


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
