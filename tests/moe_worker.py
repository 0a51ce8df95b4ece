"""Run in a subprocess by tests/test_moe.py, with 8 simulated CPU devices.

    python tests/moe_worker.py '{"steps": 5, "meshes": {"one": {"data": 1}, ...}}'

Trains experiments/mixtral.py:tiny (ragged, dropless; one layer), or the spec's "config" file's
tiny preset (or its "experiment", FILE:PRESET, whose own objective then trains), with the spec's
"model" fields and "num_layers", on the same batches under each mesh of the spec (a mesh of
{"data": 1} runs on one device; a mesh's own "model" entry changes fields for it alone), and
reports each run's losses and the collectives of its compiled step; a model with DeepSeek-V3's
routers' bias also reports the bias after the last step. Prints one JSON object.
"""

import json
import math
import os
import pathlib
import re
import sys
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers_jax.machine import parallel  # noqa: E402
from transformers_jax.config import ModelConfig, load_config_module  # noqa: E402
from transformers_jax.tasks import task_data, task_for  # noqa: E402
from transformers_jax.train import optim  # noqa: E402
from transformers_jax.train.step import make_train_step  # noqa: E402
from transformers_jax.train.state import create_state  # noqa: E402


def run(config, model_cfg, task, batches, axes):
  axes = dict(axes)
  model_cfg = model_cfg.replace(**axes.pop("model", {}))
  devices = jax.devices()[: math.prod(axes.values())]
  mesh = parallel.make_mesh(axes, devices)
  rules = parallel.rules()
  tx = optim.make_optimizer(config)
  state, shardings = create_state(model_cfg, tx, mesh, rules, config.seed)
  step = make_train_step(
      task, model_cfg, config, tx, optim.schedule(config), mesh, rules, shardings
  )
  # compiled once: its text for the collectives, and the program the steps run
  compiled = step.lower(state, parallel.put_batch(batches[0], mesh)).compile()
  text = compiled.as_text()
  losses, metrics = [], {}
  for batch in batches:
    state, metrics = compiled(state, parallel.put_batch(batch, mesh))
    losses.append(float(metrics["loss"]))
  biases = [
      leaf.ravel().tolist()
      for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]
      if "e_score_correction_bias" in jax.tree_util.keystr(path)
  ]
  return {
      "bias": biases,
      "losses": losses,
      "collectives": sorted(set(re.findall(r"\b(all-to-all|all-gather|reduce-scatter)\(", text))),
      "metrics": {k: float(v) for k, v in metrics.items() if k.startswith("moe_")},
  }


def main():
  spec = json.loads(sys.argv[1])
  default = spec.get("config", "mixtral.py") + ":tiny"
  file, _, preset = spec.get("experiment", default).partition(":")
  config = load_config_module(str(ROOT / "experiments" / file)).get_config(preset)
  config.unlock()
  config.batch_size, config.seq_len = 8, 32
  config.model.num_layers = spec.get("num_layers", 1)
  config.moe_router_z_weight = 1e-3
  for key, value in spec.get("model", {}).items():
    config.model[key] = value
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_for(model_cfg, config)
  with tempfile.TemporaryDirectory() as tmp:
    data = task_data(task, config, model_cfg, tmp)
    batches = [data.train_batch(s) for s in range(spec["steps"])]
  out = {name: run(config, model_cfg, task, batches, axes) for name, axes in spec["meshes"].items()}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
