"""How commands end when something goes wrong: a checkpoint that does not fit is refused before
anything is read (no asyncio tracebacks), a data worker that dies is one error line, workers that
end normally leave no shared memory behind, and a host without an accelerator runs JAX on the
CPU without loading libtpu."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT, subprocess_env


def test_a_checkpoint_of_other_shapes_is_refused_before_reading(tmp_path, capfd):
  from transformers_jax.run_folder import checkpoints as checkpoints_lib

  saved = {f"w{i:02d}": jnp.full((2, 64), i, jnp.float32) for i in range(40)}
  checkpoints = checkpoints_lib.Checkpoints(tmp_path / "ck", async_save=False)
  checkpoints.save(1, saved)
  checkpoints.wait()
  wanted = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in saved.items()}
  wanted["w07"] = jax.ShapeDtypeStruct((3, 64), jnp.float32)  # one more member, say
  with pytest.raises(ValueError, match=r"Requested shape: \(3, 64\).*stored shape: \(2, 64\).*w07"):
    checkpoints.restore(1, wanted)
  wanted["w07"] = jax.ShapeDtypeStruct((2, 64), jnp.float32)
  np.testing.assert_array_equal(checkpoints.restore(1, wanted)["w07"], saved["w07"])
  checkpoints.close()
  # a restore abandoned part way leaves reads whose callbacks print "Event loop is closed"
  assert "Traceback" not in capfd.readouterr().err


WORKER_MODULE = """
import os, signal
import numpy as np

def batch(step):
  if step == int(os.environ.get("KILL_AT_STEP", "-1")):
    os.kill(os.getpid(), signal.SIGKILL)  # the worker computing this step dies
  return {"x": np.full((16, 256), step, np.int32)}
"""

STREAM = """
def main(argv):
  from transformers_jax.data import pipeline
  import batches

  stream = pipeline.batch_stream(batches.batch, 0, int(argv[0]), workers=2, prefetch=2)
  got = [int(b["x"][0, 0]) for b in stream]
  stream.close()
  print(got)

if __name__ == "__main__":  # (the workers import this file too: they need nothing of it)
  from transformers_jax import cli

  cli.run_script(main)
"""


@pytest.fixture(scope="module")
def stream_script(tmp_path_factory):
  folder = tmp_path_factory.mktemp("stream")
  (folder / "batches.py").write_text(WORKER_MODULE)
  (folder / "stream.py").write_text(STREAM)
  return folder


def run_stream(folder, steps: int, **env):
  environment = subprocess_env()
  environment["PYTHONPATH"] = f"{folder}:{ROOT}"
  environment.pop("PYTHONWARNINGS", None)
  environment.update(env)
  return subprocess.run(
      [sys.executable, str(folder / "stream.py"), str(steps)],
      capture_output=True,
      text=True,
      cwd=folder,
      env=environment,
      timeout=300,
  )


def test_workers_that_finish_leave_no_shared_memory(stream_script):
  done = run_stream(stream_script, 12, PYTHONWARNINGS="default")  # warnings shown
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == str(list(range(12)))  # every step once, in order, none past
  assert "leaked shared_memory" not in done.stderr and not done.stderr.strip(), done.stderr


def test_a_data_worker_that_dies_is_one_error_line(stream_script):
  done = run_stream(stream_script, 40, KILL_AT_STEP="5")
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
  assert lines[0].startswith("error: a data worker process ended unexpectedly")
  assert "data.workers=0" in lines[0]


def test_a_host_without_accelerators_runs_jax_on_the_cpu_alone():
  probe = textwrap.dedent("""
      import os
      from transformers_jax import cli
      cli.quiet_cpu_host()
      import jax
      print(os.environ.get("JAX_PLATFORMS"), jax.default_backend())
      """)
  environment = subprocess_env()
  environment.pop("JAX_PLATFORMS")
  done = subprocess.run(
      [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=environment
  )
  from jax._src import hardware_utils

  accelerator = (
      hardware_utils.num_available_tpu_chips_and_device_id()[0]
      or hardware_utils.has_visible_nvidia_gpu()
  )
  assert done.returncode == 0, done.stderr[-2000:]
  if accelerator:  # a machine with a TPU or GPU keeps JAX's own choice
    assert done.stdout.split()[0] == "None"
  else:  # libtpu (the test extra) is not loaded: none of its warnings
    assert done.stdout.split() == ["cpu", "cpu"]
    assert "TPU" not in done.stderr and "libtpu" not in done.stderr, done.stderr
