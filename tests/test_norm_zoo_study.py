"""The norm zoo study's probes and report (scripts/block_contribution.py, amplification.py,
norm_zoo_report.py): what they measure is what their docstrings say."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from conftest import load_script
from transformers_jax import models
from transformers_jax.config import ModelConfig


def test_a_skipped_pre_ln_block_is_the_identity_and_costs_nothing():
  """Block 1 of a 2-block pre-LN decoder with its output projections zeroed: the probe finds it
  turns the residual stream by no angle and skipping it changes no loss; block 0 does turn it."""
  probe = load_script("block_contribution")
  cfg = ModelConfig(
      family="decoder", vocab_size=64, d_model=16, num_heads=2, num_layers=2, max_len=16
  )
  params = nn.unbox(jax.jit(models.initializer(cfg))(jax.random.PRNGKey(0)))  # one program
  block = params["decoder"]["layer_1"]
  for sub, proj in probe.BRANCH_OUTPUTS:
    block[sub][proj] = jax.tree_util.tree_map(jnp.zeros_like, block[sub][proj])
  tokens = np.random.default_rng(0).integers(0, 64, (4, 9))
  found = probe.measure_member(cfg, params, [tokens])
  assert abs(found["angular_distance"][1]) < 1e-3  # arccos near 1 is only float32-exact to ~1e-3
  assert abs(found["skip_loss_increase"][1]) < 1e-6
  assert found["angular_distance"][0] > 1e-2
  assert 0 < found["loss"] < 2 * math.log(64)


def test_amplification_grows_linearly_with_a_small_perturbation():
  """Twice the noise, twice the relative output change (to first order), and none without."""
  amplification = load_script("amplification")
  change, _ = amplification.change_fn("post", 2, 0.25)
  none, small, double = (float(change(0, eps)) for eps in (0.0, 0.01, 0.02))
  assert none == 0 and small > 0
  assert abs(double / small - 2) < 0.1


def test_report_reads_best_configuration_and_steps_to_a_shared_loss():
  report = load_script("norm_zoo_report")

  def member(lr, seed, losses):
    return {
        "learning_rate": lr,
        "warmup_steps": 0,
        "seed": seed,
        "eval_loss": losses[-1],
        "eval_losses": losses,
        "eval_steps": [100, 200, 300],
    }

  def record(name, members):
    return {"name": name, "vocab_size": 256, "members": members}

  lm = {
      "pre-L12": record(
          "pre-L12", [member(1e-2, 0, [3.0, 2.6, 2.4]), member(1e-3, 0, [3.5, 3.2, 3.0])]
      ),
      "post-L12": record("post-L12", [member(1e-2, 0, [3.1, 2.9, 2.5])]),
      "rezero-L12": record("rezero-L12", [member(1e-2, 0, [2.5, 2.3, 2.2])]),
  }
  at, values = report.best_config(lm["pre-L12"])
  assert at == (1e-2, 0) and values == [2.4]
  rows = report.rezero(lm)
  # the shared target is the worst best loss (post's 2.5): pre reaches it at 300, ReZero at 100
  assert "step 300" in rows[0] and "step 300" in rows[1] and "step 100" in rows[2]
  assert report.first_step_at([100, 200], [3.0, 2.9], 2.5) is None


def test_width_trend_counts_a_change_only_beyond_the_seed_bands():
  report = load_script("norm_zoo_report")
  assert report.width_trend([0.3, 0.4, 0.5], [0.05, 0.05, 0.05]) == "opening"
  assert report.width_trend([0.5, 0.4, 0.3], [0.05, 0.05, 0.05]) == "closing"
  assert report.width_trend([0.30, 0.33, 0.36], [0.05, 0.05, 0.05]) == "flat"  # 0.06 < 0.1
  assert report.width_trend([0.3, 0.9, 0.5], [0.05, 0.05, 0.05]) == "opening, not monotone"


def test_depth_exponent_recovers_a_power_law_and_contributions_split_thirds(tmp_path):
  report = load_script("norm_zoo_report")
  assert (
      abs(report.depth_exponent([6, 12, 24, 48], [d**-0.5 for d in (6, 12, 24, 48)]) + 0.5) < 1e-9
  )
  rows = [
      {
          "run": "pre-L6",
          "seed": s,
          "learning_rate": 1e-2,
          "loss": 2.0 + s,
          "skip_loss_increase": [1, 1, 0, 0, 0.1, 0.3],
          "angular_distance": [0.2] * 6,
      }
      for s in (0, 1)
  ]
  (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  run = report.contributions(tmp_path / "c.jsonl")["pre-L6"]
  assert run["seeds"] == [0, 1] and run["loss"] == [2.0, 3.0]
  assert run["skip_first"] == [1, 1] and abs(run["skip_last"][0] - 0.2) < 1e-12
