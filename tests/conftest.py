"""Test-wide setup: run JAX on the CPU and import the experiment config files by path."""

import gc
import math
import os
import pathlib
import sys
import tempfile

# JAX's tracing makes millions of short-lived objects: with Python's default thresholds (700, 10,
# 10) the cyclic collector ran 2,300 times over test_norm_zoo.py and took 1.9 of its 45 CPU-s
# (4%), 1.5 of 37 over test_train.py's training tests; with these, 15 times and 0.5 CPU-s. No test
# depends on when garbage is collected. tests/forkserver.py sets the same for its children.
GC_THRESHOLDS = (50_000, 20, 20)
gc.set_threshold(*GC_THRESHOLDS)
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set (some sandboxes set it): without
# it every process of the run (each xdist worker, fork server and command line) compiles the
# package from source and pytest rewrites every test module again, 1.4 of a worker's 4.7 CPU-s of
# collection. The pytest processes write it (into the gitignored __pycache__ folders); the others
# read it whatever their environment says.
sys.dont_write_bytecode = False

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache for the whole run (every xdist worker and every subprocess a test
# starts): the many small runs of the same tiny configs compile each step once.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"transformers_jax_tests_{_RUN_ID}"),
)
# Every program goes to the cache, however quickly it compiled: with the fast compiles below most
# steps take under 0.5 s, and a run that compiles the same program again (a resume, a second
# train() of one config, a command line repeating an in-process run) reads it back instead.
# test_population.py and test_pods.py together took 7% less CPU time than with the 0.5 s floor;
# the cache of a whole run holds a few tens of MB.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Every process of the run (this one, the xdist workers, the multi-device workers and command
# lines the tests start) compiles far more than it runs, so all compile with LLVM's lowest
# optimisation level: measured on the 2-core machine, test_model.py's CPU time falls by 29%,
# test_population.py's by 27% and test_train.py's (which trains the longest) by 15%. They also
# emit fusions through XLA:CPU's older elemental emitters rather than its MLIR fusion emitters:
# the losses of 30 steps of gpt2, bert and transformer tiny agree to float32 rounding (1e-7), and
# each train step compiles in 20-40% less time. LLVM's code generation runs as one module
# rather than split into parallel parts (which the 2-core machine's busy workers cannot use):
# the four families' train steps compile in about 8% less CPU time; the code computes alike.
# (Every process gets these flags, so runs that the tests compare bit for bit compile alike.)
FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    " --xla_cpu_parallel_codegen_split_count=1"
)
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


def assert_close(a, b, rel=1e-5):
  """max |a - b| within `rel` of max |b| (float32)."""
  import numpy as np

  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  assert a.shape == b.shape
  err, scale = np.max(np.abs(a - b)), np.max(np.abs(b))
  assert err <= rel * scale, f"max error {err:.2e} vs scale {scale:.2e}"


def run_worker(script: str, spec=None, devices: int | None = None):
  """Run tests/<script> in a subprocess (the spec as its JSON argument, `devices` simulated CPU
  devices) and return the JSON object its last line prints; its stderr's end when it fails."""
  import json

  args = [] if spec is None else [json.dumps(spec)]
  out = run_python([str(ROOT / "tests" / script), *args], env=subprocess_env(devices))
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ python subprocesses
# A test's `python ...` command lines run as children forked from a Python process that has
# imported JAX and the package already (tests/forkserver.py): each is still a process of its
# own, with its own environment, working directory, streams, exit status and JAX backend
# (XLA_FLAGS, the simulated device count included, is read when the child starts it), but it
# does not pay the 2-3 CPU-s of importing JAX again. One server per pytest process and per set
# of the environment variables read at import time; TEST_FORKSERVER=0 runs plain subprocesses.
# (Linux: the client waits for a child through a pidfd; elsewhere plain subprocesses)
_FORKSERVER_OFF = os.environ.get("TEST_FORKSERVER") == "0" or not hasattr(os, "pidfd_open")
# read only when a backend starts, or only by the tests: a child may set them as it likes
_PER_CHILD_ENV = ("XLA_FLAGS", "PYTEST_CURRENT_TEST", "TEST_CPU_RECORD")
_servers: dict = {}
# processes forked for the tests, and their CPU seconds (not children of this process, so the
# CPU record adds them itself); a server's import CPU counts toward the test that started it
_forked = {"processes": 0, "cpu_s": 0.0}


class _ForkServer:

  def __init__(self, env: dict):
    import json
    import subprocess

    self.proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "forkserver.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    ready = self.proc.stdout.readline()
    if not ready:
      raise RuntimeError(f"tests/forkserver.py did not start (exit status {self.proc.wait()})")
    _forked["cpu_s"] += json.loads(ready)["cpu_s"]

  def ask(self, request: dict) -> dict:
    import json

    self.proc.stdin.write(json.dumps(request) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"tests/forkserver.py ended (exit status {self.proc.wait()})")
    return json.loads(line)


def _server_for(env: dict, slot: int = 0) -> _ForkServer:
  """The server for `env`; `slot` i > 0 is another server for the same environment, with a hash
  seed of its own (process i of a multi-process run)."""
  variables = tuple(sorted((k, v) for k, v in env.items() if k not in _PER_CHILD_ENV))
  if (variables, slot) not in _servers:
    _servers[variables, slot] = _ForkServer(dict(variables))
  return _servers[variables, slot]


class ForkedProcess:
  """A child of the fork server with the part of subprocess.Popen's interface the tests use
  (pid, returncode, poll, wait, communicate, send_signal, kill); its output goes to files and is
  read, as text, when it has ended."""

  def __init__(self, server: _ForkServer, pid: int, files: dict, args: list):
    self.server, self.pid, self.files, self.args = server, pid, files, args
    self.returncode = None

  def _ended(self, reply: dict) -> int:
    self.returncode = reply["returncode"]
    _forked["processes"] += 1
    _forked["cpu_s"] += reply["cpu_s"]
    return self.returncode

  def poll(self):
    if self.returncode is None:
      reply = self.server.ask({"wait": self.pid, "block": False})
      if "running" not in reply:
        self._ended(reply)
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    import select
    import subprocess

    if self.returncode is None:
      # the child is not this process's to wait for: a pidfd says when it has ended (it stays a
      # zombie, its pid not reused, until the server reaps it)
      pidfd = os.pidfd_open(self.pid)
      try:
        if not select.select([pidfd], [], [], timeout)[0]:
          raise subprocess.TimeoutExpired(self.args, timeout)
      finally:
        os.close(pidfd)
      self._ended(self.server.ask({"wait": self.pid, "block": True}))
    return self.returncode

  def communicate(self, timeout: float | None = None):
    import shutil

    self.wait(timeout)
    said = self.output("stdout"), self.output("stderr")
    shutil.rmtree(os.path.dirname(self.files["stdout"]), ignore_errors=True)
    return said

  def wait_for_line(self, predicate, timeout: float) -> bool:
    """Whether the child printed, within `timeout` seconds, a line of stdout that `predicate`
    accepts (False when it ended or the time ran out first)."""
    import time

    end, seen = time.monotonic() + timeout, 0
    while time.monotonic() < end:
      with open(self.files["stdout"], encoding="utf-8", errors="replace") as f:
        text = f.read()
      lines = text.split("\n")[:-1]  # whole lines only
      if any(predicate(line) for line in lines[seen:]):
        return True
      seen = len(lines)
      if self.poll() is not None:
        return False
      time.sleep(0.05)
    return False

  def output(self, stream: str) -> str | None:
    path = self.files.get(stream)
    if path is None:
      return None
    with open(path, encoding="utf-8", errors="replace") as f:
      return f.read()

  def send_signal(self, signum: int) -> None:
    if self.returncode is None:
      os.kill(self.pid, signum)

  def kill(self) -> None:
    import signal

    self.send_signal(signal.SIGKILL)

  def terminate(self) -> None:
    import signal

    self.send_signal(signal.SIGTERM)


def _popen(args, env: dict, cwd, stderr_to_stdout: bool):
  """`python *args` as a plain subprocess, with text pipes (and wait_for_line)."""
  import subprocess

  class Piped(subprocess.Popen):

    def wait_for_line(self, predicate, timeout: float) -> bool:
      del timeout  # (each line is read as it comes: the caller's own timeouts bound the run)
      return any(predicate(line) for line in self.stdout)

  return Piped(
      [sys.executable, *args],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
      stdin=subprocess.DEVNULL,
      text=True,
      cwd=cwd,
      env=env,
  )


def start_python(
    args, env: dict | None = None, cwd=ROOT, stderr_to_stdout: bool = False, server: int = 0
):
  """`python *args` started as a child of the fork server (a plain subprocess where the server
  cannot run it): a ForkedProcess, or a subprocess.Popen with text pipes. Children of one
  `server` share its hash seed: give each process of a multi-process run its own."""

  args = [str(a) for a in args]
  env = dict(os.environ if env is None else env)
  forkable = args and (args[0] in ("-m", "-c") and len(args) > 1 or not args[0].startswith("-"))
  if _FORKSERVER_OFF or not forkable:
    return _popen(args, env, cwd, stderr_to_stdout)
  server = _server_for(env, server)
  out_dir = tempfile.mkdtemp(prefix="forked_")
  files = {"stdout": os.path.join(out_dir, "stdout")}
  files["stderr"] = files["stdout"] if stderr_to_stdout else os.path.join(out_dir, "stderr")
  for path in files.values():  # there before the child starts: readable while it runs
    open(path, "w").close()
  spec = dict(argv=args, env=env, cwd=str(cwd), stdin=os.devnull, **files)
  reply = server.ask({"spawn": spec})
  if "fallback" in reply:
    return _popen(args, env, cwd, stderr_to_stdout)
  if stderr_to_stdout:
    files.pop("stderr")
  return ForkedProcess(server, reply["pid"], files, [sys.executable, *args])


def start_python_cluster(command, num_processes: int, env: dict | None = None, **kw):
  """local_cluster.start_processes for `python` command lines, through the fork server: process
  i runs `python *command(i, address)`, with `address` the coordinator's (localhost and a free
  port). Keywords as start_python's."""
  from transformers_jax.machine.local_cluster import free_port

  address = f"localhost:{free_port()}"
  # each from a server of its own: separate interpreters differ in hash seed, so an order that
  # depends on it (a set of names) differs between the processes, as it would on a cluster
  return [start_python(command(i, address), env=env, server=i, **kw) for i in range(num_processes)]


def run_python(args, env: dict | None = None, cwd=ROOT, timeout: float | None = None):
  """subprocess.run([sys.executable, *args], capture_output=True, text=True, ...) for a test,
  through the fork server: a subprocess.CompletedProcess."""
  import subprocess

  proc = start_python(args, env=env, cwd=cwd)
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    raise
  return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def load_script(name: str):
  """scripts/<name>.py as a module, registered in sys.modules (dataclasses defined in a script
  look their module up there)."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


def shaken(tree, scale: float, seed: int = 1):
  """`tree` with every leaf moved by scale * N(0, 1), each leaf's key split from PRNGKey(seed):
  initial parameters shaken so that every part of a tiny model acts (experts' choices vary)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  leaves = [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return jax.tree_util.tree_unflatten(treedef, leaves)


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
    "test_population.py",
    "test_slurm.py",  # little CPU, but its jobs take minutes of wall time: started early
    "test_pods.py",
    "test_scale.py",
    "test_parallel.py",
    "test_norm_zoo.py",
    "test_model.py",
    "test_moe.py",
    "test_decode.py",
    "test_checkpoint_meshes.py",
    "test_counting.py",
    "test_experiments.py",
    "test_attention_impls.py",
    "test_data_pipeline.py",
    "test_context.py",
)


def pytest_collection_modifyitems(session, config, items):
  rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


# Per-test CPU accounting, on when TEST_CPU_RECORD names a file: each test (its setup, call and
# teardown, so a module fixture counts toward the first test that uses it) appends one JSON line
# with its wall seconds, the CPU seconds of the process that ran it (`own`: tracing, compiling and
# running in the pytest worker) and of the subprocesses it waited for (`children`: command lines,
# multi-device and multi-process workers, the fork server's children and its imports included),
# how many processes it started (forked ones too), and how many XLA compilations the pytest
# worker ran for it (a count that does not depend on the machine's load, unlike the seconds) with
# their seconds and those of tracing. scripts/test_cost_report.py sums the lines by file and by
# test.
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
    spawned, events, forked = _spawned[0], dict(_jax_events), dict(_forked)
    yield
    wall, own, children = (
        time.perf_counter() - start[0],
        _cpu(resource.RUSAGE_SELF) - start[1],
        _cpu(resource.RUSAGE_CHILDREN) - start[2] + _forked["cpu_s"] - forked["cpu_s"],
    )
    line = {
        "test": item.nodeid,
        # which xdist worker ran it, and when it ended (seconds since the epoch): the schedule
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "end": round(time.time(), 2),
        "wall_s": round(wall, 3),
        "own_cpu_s": round(own, 3),
        "children_cpu_s": round(children, 3),
        "processes": _spawned[0] - spawned + _forked["processes"] - forked["processes"],
        "compiles": _jax_events["compiles"] - events["compiles"],
        "compile_s": round(_jax_events["compile_s"] - events["compile_s"], 3),
        "trace_s": round(_jax_events["trace_s"] - events["trace_s"], 3),
    }
    with open(_CPU_RECORD, "a") as f:
      f.write(json.dumps(line) + "\n")


def _stop_servers():
  for server in _servers.values():
    server.proc.stdin.close()  # the server ends when its stdin does
    server.proc.wait()


import atexit  # noqa: E402

atexit.register(_stop_servers)
