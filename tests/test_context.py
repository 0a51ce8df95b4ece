"""Context parallelism (modules/context.py): sequences split over the `context` mesh axis train
exactly as whole ones, the compiler gathers keys/values over that axis only, per-device
temporaries shrink with it, zig-zag order balances causal work, and lengths that cannot split are
refused with one clear error."""

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, example_inputs
from transformers_jax.modules.context import from_zigzag, to_zigzag, zigzag_order
from transformers_jax.train import compile as compile_step
from transformers_jax.train_config import validate_context

from conftest import run_worker


@pytest.fixture(scope="module")
def runs():
  # the decoder through flash attention (blocks of 16: several per device), the encoder through
  # the einsum reference; one block each (every block splits its sequence alike)
  flash = {"attention_impl": "flash", "attention_block_q": 16, "attention_block_kv": 16}
  model = {"gpt2": {**flash, "num_layers": 1}, "bert": {"num_layers": 1}}
  spec = {"families": ["gpt2", "bert"], "steps": 5, "model": model}
  return run_worker("context_worker.py", spec, devices=8)


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_training_split_over_context_4_equals_whole_sequences(runs, family):
  whole, split = runs[family]["whole"], runs[family]["context4"]
  assert len(whole) == 5 and whole[0] != whole[-1]  # it trains
  np.testing.assert_allclose(split, whole, rtol=1e-5)


def test_keys_and_values_are_gathered_over_context_and_temporaries_shrink(runs):
  one, four = runs["compiled"]["context1"], runs["compiled"]["context4"]
  assert one["collectives"] == {}  # data 2 on 2 devices: nothing to gather or scatter
  # data 2 x context 4 over 8 devices: devices 0-3 hold one sequence, 4-7 the other; keys and
  # values are gathered (and their gradients reduce-scattered) within each group only
  groups = ["{{0,1,2,3},{4,5,6,7}}"]
  assert four["collectives"] == {"all-gather": groups, "reduce-scatter": groups}
  # each device holds a quarter of the tokens: well under half of the temporaries (a scan over
  # layers that hoisted every block's mask out of the loop would hold more than the whole)
  assert four["temp"] < 0.5 * one["temp"], (four["temp"], one["temp"])


def test_zigzag_gives_each_device_an_early_and_a_late_chunk():
  order = zigzag_order(16, 4)  # 8 chunks of 2 tokens; device i holds chunks i and 7 - i
  chunks = order.reshape(4, 2, 2)[:, :, 0] // 2
  assert chunks.tolist() == [[0, 7], [1, 6], [2, 5], [3, 4]]
  # causal work per device (keys each query attends) is equal
  work = (order.reshape(4, 4) + 1).sum(axis=1)
  assert len(set(work.tolist())) == 1
  x = np.arange(2 * 16 * 3).reshape(2, 16, 3)
  np.testing.assert_array_equal(from_zigzag(to_zigzag(x, 4), 4), x)
  np.testing.assert_array_equal(to_zigzag(x, 4)[:, :, 0] // 3 % 16, np.stack([order] * 2))


def test_lengths_that_do_not_split_are_one_clear_error(experiment):
  config = experiment("gpt2", "tiny")
  config.mesh.context = 4
  model_cfg = ModelConfig.from_dict(config.model)
  config.seq_len = 60  # not a multiple of 2 x 4 zig-zag chunks
  with pytest.raises(ValueError, match=r"mesh.context=4: seq_len of 60 .* multiple of 8"):
    validate_context(config, model_cfg)
  config.seq_len = 64
  validate_context(config, model_cfg)
  with pytest.raises(ValueError, match="attention_dropout=0"):
    validate_context(config, model_cfg.replace(attention_dropout=0.1))


def test_kv_cache_decoding_is_refused_over_context(experiment):
  model_cfg = ModelConfig.from_dict(experiment("gpt2", "tiny").model)
  model = build_model(model_cfg, decode=True)
  mesh = AbstractMesh((1, 1, 2, 1, 1), ("data", "fsdp", "context", "tensor", "expert"))
  with jax.sharding.use_abstract_mesh(mesh), pytest.raises(ValueError, match="mesh.context=1"):
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *example_inputs(model_cfg)))


def test_context_composes_with_a_tpu_topology(experiment):
  config = experiment("gpt2", "tiny")
  config.mesh.topology = "v5e:2x2"
  config.mesh.data, config.mesh.context = 2, 2
  config.model.num_layers = 1  # each block splits its sequence alike
  report = compile_step.report(config, verbose=False)
  assert report["mesh"]["context"] == 2 and report["mesh"]["data"] == 2
  assert report["fits"] and report["per_device_peak_xla_gib"] > 0
