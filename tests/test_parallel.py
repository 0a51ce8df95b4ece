"""Sharding: every mesh gives the losses of one device; weights are split as the rules say;
two processes equal one; a checkpoint moves between meshes; bad meshes are refused early.

Multi-device runs happen in subprocesses with 8 simulated CPU devices (XLA_FLAGS must be set
before JAX starts, and this test process has already started it with one device).
"""

import json
import pathlib
import shutil
import types

import numpy as np
import pytest

from transformers_jax.machine import local_cluster, parallel
from transformers_jax.config import ModelConfig
from transformers_jax.models import build_model, example_inputs

from conftest import ROOT, run_python, run_worker, start_python_cluster, subprocess_env

MESHES = {
    "one": {"data": 1, "devices": 1},
    "data8": {"data": 8},
    "fsdp8": {"fsdp": 8},
    "fsdp4_tensor2": {"fsdp": 4, "tensor": 2},
}
FAMILIES = ["gpt2", "bert", "transformer", "vit"]


def env(devices: int) -> dict:
  return subprocess_env(devices)


# Which family trains on which mesh. gpt2 trains on every mesh: pure data parallelism (data8),
# parameters split over fsdp (fsdp8), and over fsdp and tensor at once (fsdp4_tensor2). The other
# families train on fsdp4_tensor2 alone, the mesh that splits their own parameters (type
# embeddings and the MLM head, cross-attention, the patch embedding and classifier) over both
# parameter axes and their own batch layout over fsdp; data8 and fsdp8 split them by the same
# logical rules over one axis each, which gpt2's runs already cover.
SHARDED = [("gpt2", mesh) for mesh in ("data8", "fsdp8", "fsdp4_tensor2")] + [
    (family, "fsdp4_tensor2") for family in FAMILIES[1:]
]


@pytest.fixture(scope="module")
def sharded_runs():
  # one block per stack: every sharding rule still applies (to layer_0), at less compile time
  runs = {family: ["one"] + [m for f, m in SHARDED if f == family] for family in FAMILIES}
  spec = {"runs": runs, "steps": 2, "meshes": MESHES, "model": {"num_layers": 1}}
  return run_worker("sharding_worker.py", spec, devices=8)


@pytest.mark.parametrize("family,mesh", SHARDED)
def test_every_mesh_gives_single_device_losses(sharded_runs, family, mesh):
  one = sharded_runs[f"{family}/one"]["losses"]
  np.testing.assert_allclose(sharded_runs[f"{family}/{mesh}"]["losses"], one, rtol=1e-5)


def test_weights_are_split_as_the_rules_say(sharded_runs):
  fsdp = sharded_runs["gpt2/fsdp8"]["shards"]
  tp = sharded_runs["gpt2/fsdp4_tensor2"]["shards"]
  for name, (full, shard) in fsdp.items():  # fsdp=8 splits the embed dimension in 8
    embed_axis = {
        "query/kernel": 0,
        "key/kernel": 0,
        "wi/kernel": 0,
        "wo/kernel": 1,
        "out/kernel": 2,
        "token_embed/embedding": 1,
    }
    axis = next(v for k, v in embed_axis.items() if name.endswith(k))
    assert shard[axis] * 8 == full[axis] and np.prod(shard) * 8 == np.prod(full), name
  q_full, q_shard = tp["decoder/layer_0/self_attn/query/kernel"]
  assert q_shard == [q_full[0] // 4, q_full[1] // 2, q_full[2]]  # heads split over tensor=2
  wi_full, wi_shard = tp["decoder/layer_0/ffn/wi/kernel"]
  assert wi_shard == [wi_full[0] // 4, wi_full[1] // 2]  # d_ff split over tensor=2
  assert tp["decoder/layer_0/ffn/wo/kernel"][1] == [wi_full[1] // 2, wi_full[0] // 4]


def train_cmd(workdir, *extra):
  return [
      "-m",
      "transformers_jax.train",
      "--config",
      str(ROOT / "experiments/gpt2.py") + ":tiny",
      "--workdir",
      str(workdir),
      "--config.steps=4",
      "--config.log_every=1",
      "--config.eval_every=0",
      "--config.checkpoint_every=2",
      "--config.sample.max_new_tokens=0",
      # one block: the mesh, the processes and the checkpoint's layout do not depend on depth
      "--config.model.num_layers=1",
      "--config.device_peak_flops=1e12",  # no CPU peak measured at start: MFU is not read here
      *extra,
  ]


def losses(workdir):
  rows = [
      json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text().split("\n") if x
  ]
  return [r["loss"] for r in rows if "loss" in r]


def test_two_processes_equal_one_and_checkpoints_move_between_meshes(tmp_path):
  mesh = ["--config.mesh.data=2", "--config.mesh.fsdp=4"]
  one = run_python(train_cmd(tmp_path / "one", *mesh), env=env(8))
  assert one.returncode == 0, one.stderr[-3000:]
  procs = start_python_cluster(
      lambda i, address: train_cmd(
          tmp_path / "two", *mesh, *local_cluster.cluster_flags(i, address, 2)
      ),
      2,
      env=env(4),
  )
  outs = [p.communicate(timeout=600) for p in procs]
  assert all(p.returncode == 0 for p in procs), outs[0][1][-3000:] + outs[1][1][-3000:]
  reference = losses(tmp_path / "one")
  assert len(reference) == 4
  np.testing.assert_allclose(losses(tmp_path / "two"), reference, rtol=1e-5)
  assert "step" in outs[0][0] and "step" not in outs[1][0]  # only process 0 reports
  # the two-process run's step-2 checkpoint continues under data=2 x tensor=4 in one process
  moved = tmp_path / "moved"
  shutil.copytree(tmp_path / "two", moved)
  shutil.rmtree(moved / "checkpoints" / "4")
  (moved / "metrics.jsonl").unlink()
  cont = run_python(train_cmd(moved, "--config.mesh.data=2", "--config.mesh.tensor=4"), env=env(8))
  assert cont.returncode == 0, cont.stderr[-3000:]
  assert "resumed from step 2" in cont.stdout
  np.testing.assert_allclose(losses(moved), reference[2:], rtol=1e-5)


def test_mesh_that_does_not_fit_is_one_line(tmp_path):
  out = run_python(train_cmd(tmp_path / "unused", "--config.mesh.data=3"), env=env(8))
  assert out.returncode == 2
  line = out.stderr.strip().splitlines()[-1]
  assert line.startswith("error: mesh") and "8" in line, line


def test_mesh_shapes():
  assert parallel.mesh_shape({"data": -1}, 8) == {"data": 8, "fsdp": 1, "tensor": 1, "expert": 1}
  assert parallel.mesh_shape({"preset": "fsdp_tensor", "data": -1}, 8)["fsdp"] == 4
  for bad, match in [
      ({"data": 3}, "needs 3 devices"),
      ({"data": -1, "fsdp": -1}, "only one"),
      ({"data": 0}, "positive"),
      ({"dat": 2}, "mesh.dat"),
      ({"preset": "zero"}, "mesh.preset"),
      ({"data": -1, "tensor": 3}, "divide"),
  ]:
    with pytest.raises(ValueError, match=match):
      parallel.mesh_shape(bad, 8)


def test_axis_that_does_not_divide_is_refused_before_compiling():
  import jax

  c = ModelConfig(num_layers=1, d_model=48, num_heads=6, vocab_size=100)
  model = build_model(c)
  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *example_inputs(c))["params"])
  fake = types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 4, "expert": 1})
  with pytest.raises(
      ValueError,
      match=r"dimension '(kv_)?heads' of size 6 does not divide over "
      r"mesh axis tensor of size 4",
  ):
    parallel.check_divisible(boxed, fake, parallel.rules())
  fine = types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 2, "expert": 1})
  with pytest.raises(ValueError, match="dimension 'embed' of size 48"):  # 48 % 5 != 0
    parallel.check_divisible(
        boxed,
        types.SimpleNamespace(shape={"data": 1, "fsdp": 5, "tensor": 1, "expert": 1}),
        parallel.rules(),
    )
  parallel.check_divisible(boxed, fine, parallel.rules())


def test_cpu_devices_splits_the_host_and_the_mesh_spans_them():
  plain = subprocess_env()  # no simulated device count: --cpu_devices sets it
  base = [
      "-m",
      "transformers_jax.train",
      "--config",
      "experiments/gpt2.py:tiny",
      "--compile_only",
      "--config.model.num_layers=1",  # the devices and the mesh do not depend on depth
  ]
  out = run_python(base + ["--cpu_devices=2"], env=plain)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout[out.stdout.index("{") :])
  assert report["devices"] == 2 and report["mesh"]["data"] == 2
  bad = run_python(base + ["--cpu_devices=-1"], env=plain)
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1].startswith("error: --cpu_devices=-1")
