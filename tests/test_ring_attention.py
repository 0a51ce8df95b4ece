"""model.context_strategy=ring (modules/context.py, ring_attention): the keys and values passed
around the context axis instead of gathered give the losses of whole sequences, causal
(zig-zag balanced) and bidirectional (with its padding mask)."""

import pytest

from conftest import run_worker


@pytest.fixture(scope="module")
def ring_runs():
  spec = {
      "families": ["gpt2", "bert"],
      "meshes": {"whole": {"data": 8}, "ring4": {"fsdp": 2, "context": 4}},
      "steps": 5,
      "batch_size": 8,
      "model": {"context_strategy": "ring", "attention_impl": "einsum"},
  }
  return run_worker("sharding_worker.py", spec, devices=8)


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_ring_attention_over_context_4_equals_whole_sequences(ring_runs, family):
  whole = ring_runs[f"{family}/whole"]["losses"]
  assert ring_runs[f"{family}/ring4"]["losses"] == pytest.approx(whole, rel=1e-5)
