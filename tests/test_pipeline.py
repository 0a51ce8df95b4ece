"""Pipeline parallelism (mesh.stage, modules/pipeline.py): the same losses as without stages,
a resume on another stage count, the bubble formula, and the refusals of what cannot run."""

import pytest

from conftest import run_worker
from transformers_jax.machine import parallel
from transformers_jax.modules import pipeline


@pytest.fixture(scope="module")
def losses(tmp_path_factory):
  """{run: {step: loss}} of pipeline_worker.py's runs on 8 simulated devices."""
  return run_worker("pipeline_worker.py", {"out": str(tmp_path_factory.mktemp("pp"))}, devices=8)


def test_stages_give_the_losses_of_one_stage_and_resume_on_another_stage_count(losses):
  plain = losses["stage_1"]
  assert sorted(plain) == ["1", "2", "3", "4", "5"]
  assert plain["5"] < plain["1"] - 0.1  # it learns: the steps differ
  for run in ("gpipe_2_then_4", "circular_2x2"):
    assert sorted(losses[run]) == sorted(plain), run
    for step, loss in plain.items():
      assert losses[run][step] == pytest.approx(loss, abs=1e-5), (run, step)


def test_the_compile_report_gives_the_schedule_and_a_stages_memory(losses):
  report = losses["report"]
  assert report["schedule"] == "circular" and report["ticks"] == 4 * 2 + 2 - 1
  assert report["bubble_fraction"] == pytest.approx(1 / 9)  # (S-1) / (M R + S-1)
  assert report["blocks_per_stage_pass"] == [1]
  assert 0 < report["per_stage_chip_peak_gib"] and 0 < report["per_stage_params_gib"]


def test_bubble_fraction_is_gpipes_and_shrinks_with_repeats():
  assert pipeline.bubble_fraction(4, 8) == pytest.approx(3 / 11)
  assert pipeline.bubble_fraction(1, 8) == 0.0
  fractions = [pipeline.bubble_fraction(4, 8, repeats) for repeats in (1, 2, 4)]
  assert fractions == pytest.approx([3 / 11, 3 / 19, 3 / 35])


def test_microbatches_keep_each_devices_rows():
  import numpy as np

  rows = np.arange(12)
  split = np.asarray(pipeline.split_microbatches(rows, 3))
  assert split.tolist() == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
  assert np.asarray(pipeline.join_microbatches(split)).tolist() == rows.tolist()


def test_stage_axis_splits_the_blocks_and_may_span_slices():
  assert dict(parallel.rules())["layers"] == "stage"
  assert parallel.mesh_shape({"stage": 2, "data": -1}, 8) == {
      "data": 4,
      "stage": 2,
      "fsdp": 1,
      "tensor": 1,
      "expert": 1,
  }
  assert parallel.dcn_shape({"dcn_stage": 2, "dcn_data": 1}, 2) == {
      "data": 1,
      "stage": 2,
      "fsdp": 1,
  }


def _tiny(experiment, **fields):
  config = experiment("gpt2", "tiny")
  config.update_from_flattened_dict({"model.scan_layers": True, "model.num_layers": 4, **fields})
  return config


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"mesh.stage": 3}, r"^mesh.stage=3: 4 blocks do not split evenly over 3 stages"),
        (
            {"mesh.stage": 2, "pipeline.repeats": 4},
            r"^mesh.stage=2: 4 blocks do not split evenly over 2 stages x 4 repeats",
        ),
        (
            {"mesh.stage": 2, "pipeline.microbatches": 5},
            r"^pipeline.microbatches=5: the batch of 16 examples does not split into 5",
        ),
        ({"mesh.stage": 2, "population.seeds": 2}, r"^mesh.stage=2: a population's members"),
        ({"mesh.stage": 2, "model.scan_layers": False}, r"^mesh.stage=2: .*scan_layers=true"),
        ({"pipeline.repeats": 2}, r"^pipeline.repeats=2: .* mesh.stage=1"),
        (
            {"mesh.stage": 2, "model.feed_forward": "moe", "model.moe_every": 2},
            r"^mesh.stage=2: .* alternate dense and MoE",
        ),
    ],
)
def test_schedules_that_cannot_run_are_refused(experiment, fields, said):
  from transformers_jax.config import ModelConfig
  from transformers_jax.train.field_checks import check_pipeline
  from transformers_jax.train.setup import with_schedule

  config = _tiny(experiment, batch_size=16, **fields)
  with pytest.raises(ValueError, match=said):
    check_pipeline(config, with_schedule(ModelConfig.from_dict(config.model), config), 1)


def test_a_stage_count_that_does_not_divide_the_devices_is_one_error_line(tmp_path):
  from conftest import run_python

  argv = ["-m", "transformers_jax.train", "--config=experiments/gpt2.py:tiny"]
  argv += ["--config.model.scan_layers=true", "--config.model.num_layers=3"]
  argv += ["--config.mesh.stage=3", f"--workdir={tmp_path / 'run'}"]
  out = run_python(argv, timeout=120)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith("error: mesh.stage=3: the pipeline stages do not divide the 1")
  assert not any((tmp_path / "run").glob("*"))  # nothing written
