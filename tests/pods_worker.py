"""One process of a two-process run, started twice by tests/test_pods.py:

    python tests/pods_worker.py COORDINATOR_ADDRESS PROCESS_ID OUT_DIR

With the parameters split over both processes' devices (fsdp over 2 x 2 simulated CPU devices)
it: writes the rows of a global batch it feeds (rows_<id>.npy, and global.npy from process 0);
trains gpt2:tiny, where process 1 alone gets a SIGTERM during step 2, then resumes it to the end
with the end-of-run sample on; trains a population of two gpt2:tiny members, the first being
that run; trains transformer:tiny with BLEU decoding at its evaluation.
What it saw goes to OUT_DIR/result_<id>.json.
"""

import json
import os
import pathlib
import signal
import sys
import time

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from transformers_jax.machine import cluster_join, parallel  # noqa: E402
from transformers_jax.errors import UserError  # noqa: E402
from transformers_jax.config import ModelConfig, load_config_module  # noqa: E402


def config_of(family: str, **fields):
  config = load_config_module(str(ROOT / "experiments" / f"{family}.py")).get_config("tiny")
  config.unlock()
  config.update(dict(log_every=1, eval_every=0, checkpoint_every=0, eval_batches=1, batch_size=8))
  config.data.max_bytes = 200_000
  config.mesh.update({"data": 1, "fsdp": -1})
  config.model.num_layers = 1  # what is checked does not depend on depth; compiling does
  for key, value in fields.items():
    if isinstance(value, dict):
      config[key].update(value)
    else:
      config[key] = value
  return config


def main():
  address, pid, out = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
  cluster_join.initialize_distributed(address, 2, pid, timeout_s=120)
  import jax

  from transformers_jax.tasks import task_data, task_for
  from transformers_jax.train import entry, loop

  result = {"process_index": jax.process_index(), "devices": jax.device_count(), "seconds": {}}
  result["cpu_s"] = {}
  clock = [time.perf_counter(), time.process_time()]

  def lap(name):  # where the time (wall and CPU) goes, for whoever trims this test
    now = time.perf_counter(), time.process_time()
    result["seconds"][name] = round(now[0] - clock[0], 1)
    result["cpu_s"][name] = round(now[1] - clock[1], 1)
    clock[:] = now

  # 1. the rows this process feeds, and (process 0) the whole global batch
  config = config_of("gpt2", seq_len=32)
  model_cfg = ModelConfig.from_dict(config.model)
  data = task_data(task_for(model_cfg), config, model_cfg, out / f"data_{pid}")
  mesh = parallel.make_mesh(config.mesh.to_dict())
  np.save(out / f"rows_{pid}.npy", loop.process_batch(data, 0, mesh, config.batch_size)["tokens"])
  if pid == 0:
    np.save(out / "global.npy", data.train_batch(0)["tokens"])
  lap("rows")

  # 2. a population of two members over both processes' devices (each member split over
  # fsdp like the solo model), member 0 being the LM run below. (It runs first: once JAX's
  # preemption service has agreed on a step to stop at, a run passing that step stops there.)
  rate = config_of("gpt2").learning_rate
  pop = config_of(
      "gpt2",
      steps=8,
      seq_len=32,
      sample=dict(max_new_tokens=0),
      population=dict(learning_rates=f"({rate!r}, {2 * rate!r})"),
  )
  result["population_step"] = entry.train(pop, out / "population")["step"]
  lap("population")

  # 3. SIGTERM to process 1 alone during step 2; then resume to the end, with the sample
  real_process_batch = loop.process_batch

  def process_batch(data, step, mesh, batch_size):
    if step == 1 and pid == 1 and not result.get("signalled"):
      result["signalled"] = True
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(2)  # the notice reaches the other process while there are steps left to agree on
    return real_process_batch(data, step, mesh, batch_size)

  loop.process_batch = process_batch
  lm = config_of("gpt2", steps=8, seq_len=32, sample=dict(max_new_tokens=6))
  try:
    entry.train(lm, out / "lm")
    result["interrupted"] = None
  except UserError as e:
    result["interrupted"] = str(e)
  lap("lm_interrupted")
  loop.process_batch = real_process_batch
  resumed = entry.train(lm, out / "lm")
  result["lm_step"], result["sample"] = resumed["step"], resumed.get("sample")
  lap("lm_resumed_and_sampled")

  # 4. seq2seq: greedy translations scored by BLEU at the evaluation
  mt = config_of(
      "transformer",
      steps=2,
      eval_every=2,
      seq_len=32,
      data=dict(max_number=999),
      sample=dict(max_new_tokens=0),
  )
  translated = entry.train(mt, out / "mt")
  result["eval_bleu"] = translated.get("eval_bleu")
  result["eval_exact_match"] = translated.get("eval_exact_match")
  lap("mt_with_bleu")
  (out / f"result_{pid}.json").write_text(json.dumps(result))


if __name__ == "__main__":
  main()
