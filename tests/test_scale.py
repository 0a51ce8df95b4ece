"""Scale, from what the compiler reports: per-device memory follows per-device work (XLA's memory
analysis on 8 simulated CPU devices, the same SPMD partitioner as TPUs and GPUs); the four
families compile for a TPU topology through libtpu; a step that cannot fit is refused with
exit code 3; the vocabulary pads for sharding without changing what the model computes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformers_jax.machine import hardware
from transformers_jax.models import counting
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, example_inputs
from transformers_jax.models.common import mask_padded_vocab
from transformers_jax.train import compile as compile_step
from transformers_jax.tasks import cross_entropy

from conftest import run_python, run_worker

FAMILIES = ["gpt2", "bert", "transformer", "vit"]


# ----------------------------------------------------------------------------- memory scaling
@pytest.fixture(scope="module")
def temp_bytes():
  # one block per stack: activations per block follow the batch as with any depth
  spec = {"families": FAMILIES, "meshes": ["fsdp8", "one"], "batches": [8, 16]}
  spec["model"] = {"num_layers": 1}
  return run_worker("scale_worker.py", spec, devices=8)


@pytest.mark.parametrize("family", FAMILIES)
def test_per_device_memory_grows_with_the_per_device_batch(temp_bytes, family):
  t = temp_bytes[family]
  eight_more_on_one = t["one"]["16"] - t["one"]["8"]  # 8 more examples on one device
  one_more_on_each = t["fsdp8"]["16"] - t["fsdp8"]["8"]  # 1 more example on each of 8 devices
  assert eight_more_on_one > 0
  # Activations split over the batch grow by about 1/8 of the single-device growth; a step
  # that replicates them over the batch (each device holding the global batch) grows by all.
  assert one_more_on_each <= eight_more_on_one / 4, t


# ----------------------------------------------------------------------------- TPU topologies
@pytest.fixture(scope="module")
def tpu_reports(experiment):
  reports = {}
  for family in FAMILIES:
    config = experiment(family, "tiny")
    config.mesh.topology = "v5e:2x2"
    if family != "gpt2":  # (gpt2 keeps its two blocks: the FLOPs test compares them scanned)
      config.model.num_layers = 1  # one block per stack compiles through libtpu like two
    reports[family] = compile_step.report(config, verbose=False)
  return reports


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_presets_compile_for_a_tpu_topology(tpu_reports, family):
  r = tpu_reports[family]
  assert (r["topology"], r["chips"], r["device_kind"], r["hbm_gib"]) == (
      "v5e:2x2",
      4,
      "TPU v5 lite",
      16,
  )
  assert r["mesh"]["data"] * r["mesh"]["fsdp"] == 4
  assert r["fits"] and 0 < r["per_device_peak_estimate_gib"] < 1
  assert r["headroom_gib"] == pytest.approx(16 - r["per_device_peak_estimate_gib"])
  assert r["xla_flops_per_device_per_step"] > 0 and r["compile_s"] > 0


def test_a_step_that_cannot_fit_is_refused_with_exit_3():
  # 2,048 sequences of 64 tokens over a 50,304-wide vocabulary: about 26 GB of float32 logits
  # per v5e chip (16 GB), before their gradient.
  out = run_python(
      [
          "-m",
          "transformers_jax.train",
          "--config",
          "experiments/gpt2.py:tiny",
          "--compile_only",
          "--config.mesh.topology=v5e:2x2",
          "--config.batch_size=8192",
          "--config.model.vocab_size=50257",
          "--config.model.vocab_multiple=128",
          "--config.model.num_layers=1",  # the logits fill the chip at any depth
      ]
  )
  assert out.returncode == 3, out.stderr[-2000:]
  report = json.loads(out.stdout)
  assert report["fits"] is False and report["per_device_peak_estimate_gib"] > 16
  assert report["headroom_gib"] < 0
  error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(error) == 1 and "fsdp" in error[0] and "remat" in error[0]


# A compiled step (no refusal from the compiler) whose peak exceeds the chip's memory: the
# data sheet's HBM is lowered to 1 MiB for this process, so the tiny model's real compile
# reports fits: false (with one block, as with two).
_SMALL_CHIP = """
import dataclasses, runpy, sys
from transformers_jax.machine import hardware
real = hardware.chip_for_topology
hardware.chip_for_topology = lambda t: dataclasses.replace(real(t), hbm_gib=1 / 1024)
sys.argv = ["train", "--config", "experiments/gpt2.py:tiny", "--compile_only",
            "--config.mesh.topology=v5e:2x2", "--config.model.num_layers=1"]
runpy.run_module("transformers_jax.train", run_name="__main__")
"""


def test_a_compiled_step_over_the_chips_memory_exits_3():
  out = run_python(["-c", _SMALL_CHIP])
  assert out.returncode == 3, out.stderr[-2000:]
  report = json.loads(out.stdout)
  assert "compiler_message" not in report  # compiled, not refused
  assert report["fits"] is False and report["per_device_temp_gib"] >= 0
  assert report["per_device_peak_estimate_gib"] > 1 / 1024 and report["headroom_gib"] < 0
  assert report["per_device_peak_xla_gib"] > 0  # XLA's own peak, beside the estimate
  assert len([line for line in out.stderr.splitlines() if line.startswith("error:")]) == 1


def test_xla_flops_are_reported_only_where_xla_counts_the_whole_step(tpu_reports, experiment):
  looped = tpu_reports["gpt2"]  # two layers in a Python loop: XLA sees every layer
  config = experiment("gpt2", "tiny")
  config.mesh.topology = "v5e:2x2"
  config.model.scan_layers = True  # one while loop: XLA would count one layer of the two
  scanned = compile_step.report(config, verbose=False)
  model = looped["model_flops_per_device_per_step"]
  assert model == scanned["model_flops_per_device_per_step"]
  assert model == looped["model_flops_per_step"] / looped["devices"]
  assert 0.8 < looped["xla_flops_per_device_per_step"] / model < 1.5
  assert "xla_flops_omitted" not in looped
  assert "xla_flops_per_device_per_step" not in scanned
  assert "loop" in scanned["xla_flops_omitted"]


def test_unknown_or_missing_topologies_are_one_line_errors():
  for topology, words in (
      ("v9:2x2", "unknown TPU generation"),
      ("v5e", "chip shape"),
      ("v5p:3x3x3", "v5p:3x3x3"),
  ):
    out = run_python(
        [
            "-m",
            "transformers_jax.train",
            "--config",
            "experiments/gpt2.py:tiny",
            "--compile_only",
            f"--config.mesh.topology={topology}",
        ]
    )
    assert out.returncode == 2 and words in out.stderr, out.stderr[-1000:]
    assert "Traceback" not in out.stderr


def test_the_mesh_lies_along_the_physical_torus():
  devices = hardware.topology_devices("v5p:4x4x4")
  from transformers_jax.machine import parallel

  mesh = parallel.make_mesh({"data": 1, "fsdp": 16, "tensor": 4}, devices)
  # Each tensor-parallel group of 4 chips is one whole torus axis: its chips differ in one
  # coordinate only.
  for group in mesh.devices.reshape(16, 4):
    coords = np.array([d.coords for d in group])
    assert sum(len(set(axis)) > 1 for axis in coords.T) == 1


@pytest.mark.parametrize(
    "kind,name",
    [
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
    ],
)
def test_device_kinds_map_to_their_data_sheets(kind, name):
  assert hardware.chip_for_kind(kind).name == name


# ----------------------------------------------------------------------------- vocabulary padding
def test_a_padded_vocabulary_computes_what_the_unpadded_one_does():
  plain = ModelConfig(vocab_size=250, max_len=16)
  padded = plain.replace(vocab_multiple=128)
  assert padded.padded_vocab == 256
  assert counting.count(padded) == counting.count(plain) == counting.analytic_count(plain)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 250, (2, 16)), jnp.int32)
  # jitted: one program each rather than a compilation per operation
  init = jax.jit(build_model(padded).init)
  params = init(jax.random.PRNGKey(0), *example_inputs(padded))["params"]
  params = jax.tree_util.tree_map(
      lambda x: getattr(x, "value", x), params, is_leaf=lambda x: hasattr(x, "names")
  )
  table = params["embed"]["token_embed"]["embedding"]
  unpadded = {**params, "embed": {**params["embed"], "token_embed": {"embedding": table[:250]}}}
  logits = jax.jit(build_model(padded).apply)({"params": params}, tokens)["logits"]
  reference = jax.jit(build_model(plain).apply)({"params": unpadded}, tokens)["logits"]
  np.testing.assert_allclose(logits[..., :250], reference, rtol=1e-6, atol=1e-6)
  assert bool(jnp.all(logits[..., 250:] < -1e8))
  targets, weights = tokens[:, 1:], jnp.ones((2, 15))
  for smoothing in (0.0, 0.1):
    a = cross_entropy(logits[:, :-1], targets, weights, smoothing, num_classes=250)
    b = cross_entropy(reference[:, :-1], targets, weights, smoothing)
    for key in a:
      np.testing.assert_allclose(a[key], b[key], rtol=1e-5)


def test_cross_entropy_matches_log_softmax_and_gather():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(3, 5, 11)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, (3, 5)))
  weights = jnp.asarray(rng.random((3, 5)), jnp.float32)
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  smoothed = 0.9 * nll - 0.1 * jnp.mean(logp, -1)
  sums = cross_entropy(logits, targets, weights, 0.1)
  np.testing.assert_allclose(sums["nll"], jnp.sum(nll * weights), rtol=1e-5)
  np.testing.assert_allclose(sums["loss"], jnp.sum(smoothed * weights), rtol=1e-5)


def test_cross_entropy_ignores_any_id_at_a_weight_zero_position():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(2, 4, 7)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 7, (2, 4)))
  weights = jnp.ones((2, 4)).at[:, -1].set(0.0)
  stray = targets.at[0, -1].set(-1).at[1, -1].set(7)  # ids outside [0, 7) where weight is 0
  a, b = cross_entropy(logits, targets, weights), cross_entropy(logits, stray, weights)
  for key in a:
    assert np.isfinite(b[key]), key
    np.testing.assert_allclose(a[key], b[key], rtol=1e-6)


def test_loss_over_a_padded_vocabulary_keeps_two_logit_sized_temporaries_on_cpu():
  """XLA:CPU does not fuse an elementwise producer into a reduction, so each [B, T, V] select
  or one-hot product before the loss's reductions is one more logits-sized temporary: the
  unembedding + loss + gradient must need no more than the logits and their gradient."""
  cfg = ModelConfig(vocab_size=4000, vocab_multiple=128, max_len=16)
  batch, length, width = 4, 64, 32
  hidden = jnp.ones((batch, length, width), jnp.float32)
  table = jnp.ones((cfg.padded_vocab, width), jnp.float32)
  targets = jnp.zeros((batch, length), jnp.int32)
  weights = jnp.ones((batch, length), jnp.float32)

  def loss(table, hidden):
    logits = mask_padded_vocab(cfg, hidden @ table.T)
    return cross_entropy(logits, targets, weights, num_classes=cfg.vocab_size)["loss"]

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(table, hidden).compile()
  logits_bytes = batch * length * cfg.padded_vocab * 4
  assert compiled.memory_analysis().temp_size_in_bytes < 2.5 * logits_bytes
