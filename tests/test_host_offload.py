"""config.host_offload: the optimizer state and the parameters kept in the host's pinned memory
between steps (train/state.py `offloaded`, `on_device`). Training with them there takes the
same steps as without; a compiled TPU step takes them as host arguments, not device ones; and
settings that cannot apply are refused in one line."""

import json

import jax
import numpy as np
import pytest

from transformers_jax.train import compile as compile_step
from transformers_jax.train.entry import train
from transformers_jax.train.setup import Setup

PARTS = "optimizer,params"


def tiny(experiment, **fields):
  config = experiment("gpt2", "tiny")
  config.model.num_layers = 1
  config.batch_size, config.seq_len = 4, 32
  config.update(fields)
  return config


def batch_for(setup, seed=0):
  rng = np.random.default_rng(seed)
  return {
      k: rng.integers(0, setup.model_cfg.vocab_size, s.shape).astype(s.dtype)
      for k, s in setup.abstract_batch().items()
  }


def test_offloaded_steps_equal_device_steps_and_stay_in_host_memory(experiment):
  losses = {}
  for parts in ("", PARTS):
    setup = Setup(tiny(experiment, host_offload=parts))
    state, step = setup.init_state(), setup.train_step()
    losses[parts] = []
    for i in range(3):
      state, metrics = step(state, batch_for(setup, i))
      losses[parts].append(float(metrics["loss"]))
    kinds = {x.sharding.memory_kind for x in jax.tree_util.tree_leaves(state.opt_state)}
    kinds |= {x.sharding.memory_kind for x in jax.tree_util.tree_leaves(state.params)}
    assert kinds == ({"pinned_host"} if parts else {"device"}), kinds
    # evaluation and the harness read the parameters wherever they are kept
    params = setup.device_params(state.params)
    assert {x.sharding.memory_kind for x in jax.tree_util.tree_leaves(params)} == {"device"}
    sums, _ = setup.eval_step()(state.params, batch_for(setup, 9))
    losses[parts].append(float(sums["loss"]))
  assert losses[PARTS] == losses[""]


def test_an_offloaded_run_samples_at_its_end_and_resumes_into_host_memory(
    experiment, tmp_path, capsys
):
  """The run's end (the sample reads whole parameters) and a resume that restores its
  checkpoint into host memory."""
  config = tiny(experiment, host_offload=PARTS, steps=2, eval_every=0, checkpoint_every=1)
  config.sample.max_new_tokens = 4
  train(config, tmp_path)
  assert (tmp_path / "sample.txt").read_text().strip()
  config.steps = 3
  train(config, tmp_path)
  assert "resumed from step 2" in capsys.readouterr().out
  assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3


def test_a_tpu_step_takes_the_offloaded_state_as_host_arguments(experiment):
  """Compiled deviceless for v5p:2x2x2: the device holds no parameter or optimizer byte as an
  argument; the host holds them all (a little more: TPU layouts pad small tensors to tiles)."""
  config = tiny(experiment, host_offload=PARTS)
  config.mesh.topology = "v5p:2x2x2"
  config.batch_size = 8
  report = compile_step.report(config, verbose=False)
  state_gib = report["per_device_params_gib"] + report["per_device_optimizer_state_gib"]
  assert state_gib <= report["per_device_host_argument_gib"] < 1.5 * state_gib
  assert report["per_device_argument_gib"] < 0.01 * state_gib  # the batch, step and key


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"host_offload": "adam"}, "'adam' is no part of the train state"),
        (
            {"host_offload": "optimizer", "population.learning_rates": "(1e-3, 3e-3)"},
            "a population's members stay in device memory",
        ),
    ],
)
def test_host_offload_that_cannot_apply_is_one_line(experiment, fields, message):
  config = tiny(experiment)
  config.update_from_flattened_dict(fields)
  with pytest.raises(ValueError, match=message):
    Setup(config)
