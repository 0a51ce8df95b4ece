"""The deep post-norm study: the gradient-at-initialisation probe (scripts/grad_at_init.py) on
a tiny translation model, and the sweep files' grids (every override a real config field)."""

import ast
import math

import numpy as np
import pytest

from conftest import ROOT, load_script
from transformers_jax.config import ModelConfig
from transformers_jax.errors import UserError
from transformers_jax.tasks import task_data, task_for


@pytest.fixture(scope="module")
def probe_records(tmp_path_factory):
  """Depth 3 translation models (encoder and decoder), 2 seeds, pre and post, Xavier-like init."""
  grad = load_script("grad_at_init")
  data = tmp_path_factory.mktemp("data")
  return {p: grad.probe("translation", p, 3, 2, 0, 8, data, init_std=0.25) for p in ("pre", "post")}


def test_probe_reports_every_layer_of_both_stacks(probe_records):
  for placement, records in probe_records.items():
    assert [r["seed"] for r in records] == [0, 1]
    for r in records:
      assert (r["task"], r["placement"], r["depth"], r["init_std"]) == (
          "translation",
          placement,
          3,
          0.25,
      )
      assert set(r["grad_norm"]) == {"encoder", "decoder"}
      for groups in r["grad_norm"].values():
        assert set(groups) == {"ffn", "attn", "block"}
        for name in ("ffn", "attn"):  # a block's gradient contains its parts'
          assert len(groups[name]) == 3
          assert all(
              0 < part <= whole * (1 + 1e-4) for part, whole in zip(groups[name], groups["block"])
          )
    # seeds differ (initialisation and batch), so their gradients do
    assert records[0]["grad_norm"]["decoder"]["ffn"] != records[1]["grad_norm"]["decoder"]["ffn"]


def test_post_norm_gradient_grows_towards_the_output_and_exceeds_pre_norms(probe_records):
  """Xiong et al. 2020 at (Xavier-like) initialisation: post-norm's decoder gradients grow
  towards the output, to above pre-norm's at the last block."""

  def last_over_first(records):
    ffn = [r["grad_norm"]["decoder"]["ffn"] for r in records]
    return sum(g[-1] / g[0] for g in ffn) / len(ffn)

  post, pre = probe_records["post"], probe_records["pre"]
  assert last_over_first(post) > 1.5
  assert last_over_first(post) > last_over_first(pre) + 0.5
  for p, q in zip(post, pre):  # the same seed: initialisation and batch
    assert p["grad_norm"]["decoder"]["ffn"][-1] > q["grad_norm"]["decoder"]["ffn"][-1]


def test_depth_exponent_and_table(tmp_path, probe_records):
  grad = load_script("grad_at_init")
  assert grad.depth_exponent([6, 12, 24], [3 * d**-0.5 for d in (6, 12, 24)]) == pytest.approx(-0.5)
  records = [r for rs in probe_records.values() for r in rs]
  grad.write_table(records, tmp_path)
  table = (tmp_path / "table.md").read_text()
  assert "| translation | decoder | post |" in table and "| translation | encoder | pre |" in table
  for r in records:  # the loss at init is near uniform over the vocabulary
    assert abs(r["loss"] - math.log(260)) < 1.5


def test_sweep_files_cover_the_issue_grid():
  lr = load_script("lr_sensitivity")
  for name, placements, depths, warmups, rates in (
      ("deep_postnorm", {"post", "pre", "sandwich"}, {12}, 3, 7),
      ("deep_postnorm_xavier", {"post", "pre", "sandwich"}, {12}, 3, 7),
      ("deep_postnorm_translation", {"post", "pre"}, {6, 12}, 2, 4),
  ):
    sweep = lr.load_sweep(ROOT / "experiments" / f"{name}.py")
    entries = sweep.populations()
    assert {e["overrides"]["model.norm_placement"] for e in entries} == placements
    assert {e["overrides"]["model.num_layers"] for e in entries} == depths
    for e in entries + sweep.populations(scale=True):
      config = lr.population_config(sweep, e, ROOT / "unused")  # every override applies
      assert len(ast.literal_eval(config.population.learning_rates)) >= rates
      assert config.population.seeds >= 3
      assert len(ast.literal_eval(config.population.warmup_steps)) == warmups
      assert config.steps >= 2000
    scaled = sweep.populations(scale=True)
    assert max(e["overrides"]["model.num_layers"] for e in scaled) >= 12


def test_report_trainable_range_and_per_seed_counts():
  report = load_script("deep_postnorm_report")
  by_lr = {1e-3: [3.0, 3.2], 1e-2: [2.5, 2.6], 1e-1: [2.6, 3.5], 1.0: [5.5, 5.5]}
  # seed means 3.1, 2.55, 3.05, 5.5: only 1e-2 is within 0.1 of the best; within 0.6, three
  assert report.trainable_rates(by_lr, 0.1) == [1e-2]
  assert report.trainable_rates(by_lr, 0.6) == [1e-3, 1e-2, 1e-1]
  # seed 0: best 2.5, within 0.1: 1e-2, 1e-1; seed 1: best 2.6, within 0.1: 1e-2 only
  assert report.per_seed_trainable(by_lr, 0.1) == [2, 1]
  diverged = {"eval_loss": float("nan"), "diverged": True}
  assert report.final_loss(diverged, math.log(256)) == math.log(256)
  assert report.final_loss({"eval_loss": 9.0}, math.log(256)) == math.log(256)


def test_eval_translations_decodes_the_first_held_out_pairs_in_one_batch(experiment, tmp_path):
  """data.eval_translations=N: the task translates the first N held-out pairs (those of the
  eval batches, in order) as one batch; 0 keeps the first two eval batches; more than the
  held-out set is an error naming the field."""
  config = experiment("transformer", "tiny")
  config.batch_size, config.eval_batches, config.data.max_number = 4, 4, 9_999
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_for(model_cfg)
  assert task_data(task, config, model_cfg, tmp_path).decode_batches is None
  config.data.eval_translations = 10
  data = task_data(task, config, model_cfg, tmp_path)
  (batch,) = data.decode_batches
  held_out = np.concatenate([b["src"] for b in data.eval_batches])
  np.testing.assert_array_equal(batch["src"], held_out[:10])
  assert batch["weights"].tolist() == [1.0] * 10
  config.data.eval_translations = 17  # 16 held-out pairs
  with pytest.raises(UserError, match="data.eval_translations=17"):
    task_data(task, config, model_cfg, tmp_path)


def test_source_len_sets_the_source_rows_alone(experiment, tmp_path):
  """data.source_len: source rows of that length (the batch layout the task declares), target
  rows of seq_len; a source that does not fit is an error naming the field, not a cut."""
  config = experiment("transformer", "tiny")
  config.batch_size, config.eval_batches, config.seq_len = 4, 1, 32
  config.data.max_number, config.data.source_len = 999, 4
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_for(model_cfg)
  data = task_data(task, config, model_cfg, tmp_path)
  declared = task.batch_shapes(model_cfg, config)
  for batch in (data.train_batch(0), data.eval_batches[0]):
    assert {k: v.shape for k, v in batch.items()} == {k: s for k, (s, _) in declared.items()}
    assert batch["src"].shape == (4, 4) and batch["tgt_out"].shape == (4, 32)
  config.data.source_len = 2  # numbers of three digits need 3
  with pytest.raises(Exception, match="src_len=2.*data.source_len"):
    task_data(task, config, model_cfg, tmp_path).train_batch(0)
