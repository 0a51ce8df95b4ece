"""Run in a subprocess by tests/test_checkpoint_meshes.py: checkpoints read on another mesh.

    python tests/crossmesh_worker.py '{"mode": "train", "out": OUT_DIR}'  # 2 simulated devices
    python tests/crossmesh_worker.py '{"mode": "read", "out": OUT_DIR}'   # 1 device

`train` trains four tiny runs on two devices, each split another way (RUNS: parameters over
fsdp, sequences over context, experts over expert, a population of two over fsdp, and blocks
over two pipeline stages), then
reads each back where it was trained. `read` reads the same runs on one device, and starts a
run from each with init_from. Both print one JSON object: per run, the greedy token ids that
`generate` prints, and a digest of the parameters loaded (and, for `read`, of the parameters
init_from put into a new run's state).
"""

import contextlib
import io
import json
import os
import pathlib
import sys

SPEC = json.loads(sys.argv[1])
DEVICES = 2 if SPEC["mode"] == "train" else 1
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from absl import flags  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conftest import param_digest  # noqa: E402

from transformers_jax import generate  # noqa: E402
from transformers_jax.config import load_config_module  # noqa: E402
from transformers_jax.run_folder.runs import Run, load_run  # noqa: E402
from transformers_jax.train.entry import train  # noqa: E402
from transformers_jax.train.setup import Setup  # noqa: E402

COMMON = {
    "steps": 1,
    "batch_size": 4,
    "seq_len": 16,
    "warmup_steps": 0,
    "log_every": 1,
    "eval_every": 0,
    "checkpoint_every": 0,
    "sample.max_new_tokens": 0,
    "data.max_bytes": 100_000,
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.max_len": 32,
    # large weights: a tiny model's greedy tokens then depend on every logit, not on a tie
    "model.init_std": 0.5,
}
# name: (preset, fields on the training mesh, fields of a one-device run started from it)
RUNS = {
    "fsdp": ("gpt2.py:tiny", {"mesh.fsdp": 2}, {}),
    "context": ("gpt2.py:tiny", {"mesh.context": 2}, {}),
    "expert": ("mixtral.py:tiny", {"mesh.expert": 2, "model.d_ff": 32}, {"model.d_ff": 32}),
    "population": (
        "gpt2.py:tiny",
        {"mesh.fsdp": 2, "population.learning_rates": "(3e-3, 1e-2)"},
        {"init_member": 1},
    ),
}
# pipeline stages: the blocks (a scanned stack) split over 2 stages; read on one device
PIPELINED = {"model.num_layers": 2, "model.scan_layers": True}
RUNS["stage"] = ("gpt2.py:tiny", {"mesh.stage": 2, **PIPELINED}, PIPELINED)
MEMBER = {"population": 1}  # the population member read


def config_of(preset: str, fields: dict):
  file, name = preset.split(":")
  config = load_config_module(str(ROOT / "experiments" / file)).get_config(name)
  config.update_from_flattened_dict({**COMMON, **fields})
  return config


def greedy_ids(workdir, member) -> str:
  """What `generate --temperature 0 --print_ids` prints for this run (its main, in-process)."""
  argv = ["generate", f"--workdir={workdir}", "--prompt_ids=1,2,3", "--max_new_tokens=6"]
  argv += ["--temperature=0", "--print_ids"] + ([] if member is None else [f"--member={member}"])
  flags.FLAGS.unparse_flags()
  flags.FLAGS(argv)
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    generate.main(argv[:1])
  return printed.getvalue().strip()


def main():
  mode, out = SPEC["mode"], pathlib.Path(SPEC["out"])
  results = {"devices": jax.device_count()}
  for name, (preset, trained_on, started) in RUNS.items():
    workdir, member = out / name, MEMBER.get(name)
    if mode == "train":
      with contextlib.redirect_stdout(io.StringIO()):
        train(config_of(preset, trained_on), workdir)
    row = {
        "generate": greedy_ids(workdir, member),
        "params": param_digest(load_run(workdir, member=member)[1]),
    }
    if mode == "read":  # a new one-device run started from it (the init_from path of train)
      config = config_of(preset, {"init_from": str(workdir), **started})
      setup = Setup(config)
      state, _, note = setup.start(Run(out / f"{name}_init").checkpoints(async_save=False))
      row["init_from"], row["init_note"] = param_digest(state.params), note
    results[name] = row
  print(json.dumps(results))


if __name__ == "__main__":
  main()
