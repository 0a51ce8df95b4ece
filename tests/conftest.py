"""Test-wide setup: run JAX on the CPU and import the experiment config files by path."""

import math
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache for the whole run (every xdist worker and every subprocess a test
# starts): the many small runs of the same tiny configs compile each step once.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"transformers_jax_tests_{_RUN_ID}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# Every process of the run (this one, the xdist workers, the multi-device workers and command
# lines the tests start) compiles far more than it runs, so all compile with LLVM's lowest
# optimisation level: measured on the 2-core machine, test_model.py's CPU time falls by 29%,
# test_population.py's by 27% and test_train.py's (which trains the longest) by 15%. They also
# emit fusions through XLA:CPU's older elemental emitters rather than its MLIR fusion emitters:
# the losses of 30 steps of gpt2, bert and transformer tiny agree to float32 rounding (1e-7), and
# each train step compiles in 20-40% less time. (Every process gets both flags, so runs that the
# tests compare bit for bit compile alike.)
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE).strip()

import jax  # noqa: E402,F401  (imported here, after XLA_FLAGS is set, for the test modules)


def subprocess_env(devices: int | None = None) -> dict:
  """The environment of a test's subprocess: CPU only, fast compiles, `devices` simulated CPU
  devices (the host's default when None)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_COMPILE)
  if devices:
    env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={devices}"
  return env


import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_worker(script: str, spec=None, devices: int | None = None):
  """Run tests/<script> in a subprocess (the spec as its JSON argument, `devices` simulated CPU
  devices) and return the JSON object its last line prints; its stderr's end when it fails."""
  import json
  import subprocess

  args = [] if spec is None else [json.dumps(spec)]
  out = subprocess.run(
      [sys.executable, str(ROOT / "tests" / script), *args],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=subprocess_env(devices),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def load_script(name: str):
  """scripts/<name>.py as a module, registered in sys.modules (dataclasses defined in a script
  look their module up there)."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


def param_digest(tree) -> str:
  """SHA-256 over every leaf of a parameter tree: its path, dtype, shape and bytes (equal
  digests: the same parameters, bit for bit, wherever they were loaded)."""
  import hashlib

  import numpy as np

  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    array = np.asarray(jax.device_get(leaf))
    h.update(f"{jax.tree_util.keystr(path)} {array.dtype} {array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
  return h.hexdigest()


@pytest.fixture(scope="session")
def experiment():
  """experiment('gpt2', 'tiny') -> the ConfigDict of that preset."""
  from transformers_jax.config import load_config_module

  def get(file: str, preset: str):
    return load_config_module(str(ROOT / "experiments" / f"{file}.py")).get_config(preset)

  return get


def lesson_positional_encoding(pos, d_model):
  """The lesson's positional_encoding, as it wrote it (interleaved sin, cos)."""
  pe = []
  for i in range(d_model // 2):
    angle = pos / 10000 ** (2 * i / d_model)
    pe += [math.sin(angle), math.cos(angle)]
  return pe


# The files that cost the most CPU time, the costliest first. pytest-xdist (`--dist loadfile`)
# hands whole files to its workers in collection order (pyproject's addopts turn off its own
# reordering by test count), so starting the long files first keeps one of them from running
# alone at the end while the other workers sit idle. Files not listed follow in their usual
# order; the order inside a file is unchanged. A wrong or stale entry costs time, not results.
COSTLIEST_FIRST = (
    "test_train.py",
    "test_parallel.py",
    "test_scale.py",
    "test_population.py",
    "test_pods.py",
    "test_slurm.py",
    "test_norm_zoo.py",
    "test_model.py",
    "test_decode.py",
    "test_checkpoint_meshes.py",
    "test_counting.py",
    "test_moe.py",
    "test_data_pipeline.py",
    "test_attention_impls.py",
    "test_experiments.py",
    "test_context.py",
)


def pytest_collection_modifyitems(session, config, items):
  rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


# Per-test CPU accounting, on when TEST_CPU_RECORD names a file: each test (its setup, call and
# teardown, so a module fixture counts toward the first test that uses it) appends one JSON line
# with its wall seconds, the CPU seconds of the process that ran it (`own`: tracing, compiling and
# running in the pytest worker) and of the subprocesses it waited for (`children`: command lines,
# multi-device and multi-process workers), how many processes it started, and how many XLA
# compilations the pytest worker ran for it (a count that does not depend on the machine's load,
# unlike the seconds) with their seconds and those of tracing. scripts/test_cost_report.py sums
# the lines by file and by test.
_CPU_RECORD = os.environ.get("TEST_CPU_RECORD")
if _CPU_RECORD:
  import json
  import resource
  import subprocess
  import time

  _spawned = [0]
  _popen_init = subprocess.Popen.__init__

  def _counting_popen_init(self, *args, **kwargs):
    _spawned[0] += 1
    _popen_init(self, *args, **kwargs)

  subprocess.Popen.__init__ = _counting_popen_init

  _jax_events = {"compiles": 0, "compile_s": 0.0, "trace_s": 0.0}

  def _on_jax_event(event, seconds, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      _jax_events["compiles"] += 1
      _jax_events["compile_s"] += seconds
    elif event == "/jax/core/compile/jaxpr_trace_duration":
      _jax_events["trace_s"] += seconds

  jax.monitoring.register_event_duration_secs_listener(_on_jax_event)

  def _cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):
    start = (time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN))
    spawned, events = _spawned[0], dict(_jax_events)
    yield
    wall, own, children = (
        time.perf_counter() - start[0],
        _cpu(resource.RUSAGE_SELF) - start[1],
        _cpu(resource.RUSAGE_CHILDREN) - start[2],
    )
    line = {
        "test": item.nodeid,
        "wall_s": round(wall, 3),
        "own_cpu_s": round(own, 3),
        "children_cpu_s": round(children, 3),
        "processes": _spawned[0] - spawned,
        "compiles": _jax_events["compiles"] - events["compiles"],
        "compile_s": round(_jax_events["compile_s"] - events["compile_s"], 3),
        "trace_s": round(_jax_events["trace_s"] - events["trace_s"], 3),
    }
    with open(_CPU_RECORD, "a") as f:
      f.write(json.dumps(line) + "\n")
