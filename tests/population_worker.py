"""A member of a population equals its solo run on two simulated CPU devices with the
parameters split over fsdp=2, on user data (a .jsonl file, documents packed into rows):

    python tests/population_worker.py OUT_DIR

trains the solo run (OUT_DIR/solo) and a population of two members (OUT_DIR/population) whose
member 0 has the solo run's seed and hyperparameters; the test compares their metrics.jsonl.
"""

import json
import os
import pathlib
import random
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers_jax.config import load_config_module  # noqa: E402
from transformers_jax.train.entry import train  # noqa: E402

STEPS = 20


def main():
  out = pathlib.Path(sys.argv[1])
  rng = random.Random(0)
  words = "the quick brown fox jumps over a lazy dog while seven wizards hex jolly frogs".split()
  docs = out / "docs.jsonl"
  docs.write_text(
      "".join(
          json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))})
          + "\n"
          for _ in range(300)
      )
  )
  fields = {
      "steps": STEPS,
      "batch_size": 4,
      "seq_len": 16,
      "log_every": 1,
      "eval_every": 0,
      "checkpoint_every": 0,
      "eval_batches": 1,
      "warmup_steps": 5,
      "learning_rate": 3e-3,
      "model.d_model": 32,
      "model.num_heads": 2,
      "model.max_len": 32,
      "model.num_layers": 1,  # the fsdp split and the packing do not depend on depth
      "sample.max_new_tokens": 0,
      "mesh.data": 1,
      "mesh.fsdp": 2,
      "data.path": str(docs),
      "data.packing": True,
      "data.cache_dir": str(out / "cache"),
  }
  for name, extra in (
      ("solo", {}),
      ("population", {"population.learning_rates": "(3e-3, 1e-3)"}),
  ):
    config = load_config_module(str(ROOT / "experiments" / "gpt2.py")).get_config("tiny")
    config.update_from_flattened_dict({**fields, **extra})
    result = train(config, out / name)
    if name == "population":
      (out / "member_devices.json").write_text(json.dumps(result["member_devices"]))


if __name__ == "__main__":
  main()
