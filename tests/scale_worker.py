"""Per-device temporary memory of the compiled train step, for tests/test_scale.py.

Run with 8 simulated CPU devices. For each family's tiny preset, compiles the step on a mesh of
all 8 devices and on a mesh of one, each at two global batch sizes (the spec's "model" field
overrides model fields), and prints XLA's per-device temporary bytes as one JSON line:
{family: {mesh: {batch: bytes}}}.
"""

import json
import sys

import jax

from transformers_jax.config import load_config_module
from transformers_jax.train.compile import compile_train_step

MESHES = {
    "fsdp8": ({"data": 1, "fsdp": 8}, 8),
    "fsdp4_tensor2": ({"data": 1, "fsdp": 4, "tensor": 2}, 8),
    "one": ({"data": 1}, 1),
}


def temp_bytes(family: str, mesh: str, batch: int, model: dict) -> int:
  config = load_config_module(f"experiments/{family}.py").get_config("tiny")
  axes, devices = MESHES[mesh]
  config.mesh.update({"preset": "", "data": 1, "fsdp": 1, "tensor": 1, **axes})
  config.batch_size = batch
  config.grad_accum_steps = 1
  config.model.update(model)
  compiled, _, _ = compile_train_step(config, jax.devices()[:devices])
  return compiled.memory_analysis().temp_size_in_bytes


def main():
  spec = json.loads(sys.argv[1])
  out = {
      f: {
          m: {b: temp_bytes(f, m, b, spec.get("model", {})) for b in spec["batches"]}
          for m in spec["meshes"]
      }
      for f in spec["families"]
  }
  print(json.dumps(out))


if __name__ == "__main__":
  main()
