"""Run in a subprocess by tests/test_context.py, with 8 simulated CPU devices.

    python tests/context_worker.py '{"families": ["gpt2", "bert"], "steps": 5,
                                     "model": {"gpt2": {"attention_impl": "flash"}}}'

Trains each family's tiny preset on the same batches with its sequences whole (data 8) and split
over mesh.context=4 (fsdp 2 x context 4), and compiles a longer-sequence decoder step with
context 1 (2 devices) and context 4 (8 devices) for XLA's memory analysis and collectives.
Prints one JSON object.
"""

import json
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
from transformers_jax.train import compile as compile_step  # noqa: E402
from transformers_jax.train import optim  # noqa: E402
from transformers_jax.train.step import make_train_step  # noqa: E402
from transformers_jax.train.state import create_state  # noqa: E402

MESHES = {"whole": {"data": 8}, "context4": {"fsdp": 2, "context": 4}}


def tiny(family):
  config = load_config_module(str(ROOT / "experiments" / f"{family}.py")).get_config("tiny")
  config.unlock()
  config.batch_size = 8
  config.model.dropout = 0.0
  return config


def losses(family, steps, tmp, model):
  config = tiny(family)
  for key, value in model.items():
    config.model[key] = value
  model_cfg = ModelConfig.from_dict(config.model)
  task = task_for(model_cfg)
  data = task_data(task, config, model_cfg, f"{tmp}/{family}")
  batches = [data.train_batch(s) for s in range(steps)]
  out = {}
  for name, axes in MESHES.items():
    mesh = parallel.make_mesh(axes)
    rules = parallel.rules()
    tx = optim.make_optimizer(config)
    state, shardings = create_state(model_cfg, tx, mesh, rules, config.seed)
    step = make_train_step(
        task, model_cfg, config, tx, optim.schedule(config), mesh, rules, shardings
    )
    out[name] = []
    for batch in batches:
      state, metrics = step(state, parallel.put_batch(batch, mesh))
      out[name].append(float(metrics["loss"]))
  return out


def compiled(context, devices, seq_len=1024):
  """XLA's temporaries per device and the collectives (kind -> replica groups) of a decoder step
  with 2 sequences of `seq_len` tokens over data 2 x context `context`: scanned layers, full
  remat, flash attention in blocks of 64."""
  config = tiny("gpt2")
  config.batch_size, config.seq_len, config.model.max_len = 2, seq_len, seq_len
  config.mesh.data, config.mesh.context = 2, context
  config.model.scan_layers, config.model.remat = True, "full"
  config.model.attention_impl = "flash"
  config.model.attention_block_q = config.model.attention_block_kv = 64
  lowered, *_ = compile_step.lower_train_step(config, jax.devices()[:devices])
  step = lowered.compile()
  collectives = {}
  for kind, groups in re.findall(
      r"(all-gather|reduce-scatter)\(.*?replica_groups=(\{\{[0-9,{}]*\}\})", step.as_text()
  ):
    collectives.setdefault(kind, sorted(set(collectives.get(kind, [])) | {groups}))
  return {"temp": step.memory_analysis().temp_size_in_bytes, "collectives": collectives}


def main():
  spec = json.loads(sys.argv[1])
  with tempfile.TemporaryDirectory() as tmp:
    results = {
        f: losses(f, spec["steps"], tmp, spec.get("model", {}).get(f, {})) for f in spec["families"]
    }
  results["compiled"] = {"context1": compiled(1, 2), "context4": compiled(4, 8)}
  print(json.dumps(results))


if __name__ == "__main__":
  main()
