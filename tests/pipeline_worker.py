"""Run in a subprocess by tests/test_pipeline.py on 8 simulated devices: a tiny 4-block decoder
trained 5 steps without stages, and again with stages: GPipe over 2 stages for 2 steps, then
resumed over 4 stages (4 microbatches) for the last 3, and the circular schedule (2 stages, 2
repeats, 4 microbatches). Prints one JSON object: per run, the loss of each step; and what
the compile report says of the circular schedule (`report`).

    python tests/pipeline_worker.py '{"out": OUT_DIR}'
"""

import contextlib
import io
import json
import os
import pathlib
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers_jax.config import load_config_module  # noqa: E402
from transformers_jax.train import compile as compile_step  # noqa: E402
from transformers_jax.train.entry import train  # noqa: E402

COMMON = {
    "steps": 5,
    "batch_size": 16,
    "seq_len": 16,
    "warmup_steps": 0,
    "log_every": 1,
    "eval_every": 0,
    "checkpoint_every": 0,
    "sample.max_new_tokens": 0,
    "data.max_bytes": 100_000,
    "model.num_layers": 4,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.max_len": 32,
    "model.scan_layers": True,
    "model.remat": "full",
}
# name: [fields of each invocation in that run's folder]
RUNS = {
    "stage_1": [{}],
    "gpipe_2_then_4": [
        {"mesh.stage": 2, "stop_after": 2},
        {"mesh.stage": 4, "pipeline.microbatches": 4},
    ],
    "circular_2x2": [{"mesh.stage": 2, "pipeline.repeats": 2, "pipeline.microbatches": 4}],
}


def config_of(fields: dict):
  config = load_config_module(str(ROOT / "experiments" / "gpt2.py")).get_config("tiny")
  config.update_from_flattened_dict({**COMMON, **fields})
  return config


def main():
  out = pathlib.Path(json.loads(sys.argv[1])["out"])
  results = {}
  for name, invocations in RUNS.items():
    for fields in invocations:
      with contextlib.redirect_stdout(io.StringIO()):
        train(config_of(fields), out / name)
    lines = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    results[name] = {row["step"]: row["loss"] for row in lines if "loss" in row}
  circular = config_of(RUNS["circular_2x2"][0])
  results["report"] = compile_step.report(circular, verbose=False)["pipeline"]
  print(json.dumps(results))


if __name__ == "__main__":
  main()
