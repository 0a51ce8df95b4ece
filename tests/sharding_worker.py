"""Run in a subprocess by tests/test_parallel.py, with 8 simulated CPU devices.

    python tests/sharding_worker.py '{"runs": {family: [mesh, ...]}, "meshes": {...}, "steps": 3}'

A mesh's entry may hold "devices" (how many of the 8 it uses) and "model" (model fields that
differ on that mesh, e.g. {"context_strategy": "ring"}).

For each family's tiny preset and each of the meshes its entry in "runs" names, trains `steps`
steps on the same batches and prints one JSON object: losses per (family, mesh), and per-device
shard shapes of a few weights.
"""

import json
import os
import pathlib
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers_jax.machine import parallel  # noqa: E402
from transformers_jax.config import ModelConfig, load_config_module  # noqa: E402
from transformers_jax.train import optim  # noqa: E402
from transformers_jax.train.step import make_train_step  # noqa: E402
from transformers_jax.train.state import create_state  # noqa: E402
from transformers_jax.tasks import task_data, task_for  # noqa: E402


def shard_shapes(state):
  """{param path: [global shape, per-device shard shape]} for a few representative weights."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    in_first_block = "layer_0/" in name or "layers/" in name
    if name.endswith("token_embed/embedding") or (
        in_first_block
        and name.endswith(("query/kernel", "key/kernel", "wi/kernel", "wo/kernel", "out/kernel"))
    ):
      out[name] = [list(leaf.shape), list(leaf.addressable_shards[0].data.shape)]
  return out


def main():
  spec = json.loads(sys.argv[1])
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    for family, meshes in spec["runs"].items():
      config = load_config_module(str(ROOT / "experiments" / f"{family}.py")).get_config("tiny")
      config.unlock()
      config.batch_size = spec.get("batch_size", 16)
      config.eval_batches = 1
      config.model.dropout = 0.0
      for key, value in spec.get("model", {}).items():
        config.model[key] = value
      model_cfg = ModelConfig.from_dict(config.model)
      task = task_for(model_cfg)
      data = task_data(task, config, model_cfg, tmp + "/" + family)
      batches = [data.train_batch(s) for s in range(spec["steps"])]
      for name in meshes:
        began = time.process_time()  # the CPU time of each run, for whoever trims this test
        axes = dict(spec["meshes"][name])
        devices = jax.devices()[: axes.pop("devices", 8)]
        run_cfg = model_cfg.replace(**axes.pop("model", {}))  # e.g. this mesh's context_strategy
        mesh = parallel.make_mesh(axes, devices)
        rules = parallel.rules()
        tx = optim.make_optimizer(config)
        state, shardings = create_state(run_cfg, tx, mesh, rules, config.seed)
        step = make_train_step(
            task, run_cfg, config, tx, optim.schedule(config), mesh, rules, shardings
        )
        losses = []
        for batch in batches:
          state, metrics = step(state, parallel.put_batch(batch, mesh))
          losses.append(float(metrics["loss"]))
        results[f"{family}/{name}"] = {"losses": losses, "shards": shard_shapes(state)}
        results[f"{family}/{name}"]["cpu_s"] = round(time.process_time() - began, 2)
  print(json.dumps(results))


if __name__ == "__main__":
  main()
