"""A Python process that has imported JAX and the package once, and forks a child for each
command line a test runs (`python -m module ...`, `python script.py ...`, `python -c code`):
each child is a fresh process that starts where a new interpreter would be after its imports,
so it skips the 2-3 CPU-s of importing JAX, Flax, Optax and Orbax. Started and driven by
conftest.run_python; not a test, and not run by hand.

Protocol: one JSON object a line on stdin, one reply a line on stdout.
  {"spawn": {"argv": [...], "env": {...}, "cwd": ..., "stdin": path, "stdout": path,
             "stderr": path}}                    -> {"pid": N} or {"fallback": "why"}
  {"wait": N, "block": true|false}              -> {"returncode": R, "cpu_s": S} or {"running": true}
The first line it prints, once its imports are done, is {"ready": true, "cpu_s": S}.

What a child does is what `python ARGS` would do after its imports: it takes the command's
environment, working directory and standard streams, sets sys.argv and sys.path[0] as the
interpreter would, runs the module, script or code as __main__, and exits through the normal
interpreter shutdown (atexit handlers run; an uncaught exception prints its traceback and exits
with status 1). Its garbage is collected less often, with conftest's thresholds. XLA reads
XLA_FLAGS when a backend starts, which happens in the child, so each command can simulate its
own number of CPU devices. Environment variables read while JAX is
imported (JAX_*, PYTHON*) must equal the server's: conftest keeps one server per such set.
Python's `random` reseeds itself in a forked child, and the child reseeds NumPy's global
generator; the children of one server share its hash seed (str hashes, set order), so the
processes of one multi-process run come from different servers, as separate interpreters would.
"""

import gc
import json
import os
import resource
import sys


def _preload():
  # What the package's command lines and the test workers import first. No module that is run
  # as __main__ (train/__main__.py, generate.py, convert.py, compare.py, param_count.py) and none
  # that imports one: running it as __main__ would define its absl flags a second time.
  import numpy  # noqa: F401
  import jax  # noqa: F401
  import jax.numpy  # noqa: F401
  import flax.linen  # noqa: F401
  import optax  # noqa: F401
  import orbax.checkpoint  # noqa: F401
  import ml_collections  # noqa: F401
  import transformers_jax.cli  # noqa: F401
  import transformers_jax.train.entry  # noqa: F401
  import transformers_jax.train.compile  # noqa: F401
  import transformers_jax.tasks  # noqa: F401
  import transformers_jax.data  # noqa: F401


ENTRY_MODULES = (
    "transformers_jax.train.__main__",
    "transformers_jax.generate",
    "transformers_jax.convert",
    "transformers_jax.compare",
    "transformers_jax.param_count",
)


def _imported_already(name: str) -> bool:
  """Whether `python -m name` would run a module this process has imported under its own name
  (a package runs its __main__)."""
  module = sys.modules.get(name)
  if module is not None and hasattr(module, "__path__"):
    return f"{name}.__main__" in sys.modules
  return module is not None


def _cpu_seconds(usage) -> float:
  return usage.ru_utime + usage.ru_stime


def _serve(requests, replies):
  """Answer requests until stdin closes; in a forked child, return its spawn request."""
  while True:
    line = requests.readline()
    if not line:
      return None
    request = json.loads(line)
    if "spawn" in request:
      spec = request["spawn"]
      argv = spec["argv"]
      if argv[0] == "-m" and _imported_already(argv[1]):
        replies.write(json.dumps({"fallback": f"{argv[1]} is imported already"}) + "\n")
        replies.flush()
        continue
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        requests.close()
        replies.close()
        return spec
      replies.write(json.dumps({"pid": pid}) + "\n")
    else:
      pid = request["wait"]
      done, status, usage = os.wait4(pid, 0 if request["block"] else os.WNOHANG)
      if done == 0:
        replies.write(json.dumps({"running": True}) + "\n")
      else:
        replies.write(
            json.dumps(
                {"returncode": os.waitstatus_to_exitcode(status), "cpu_s": _cpu_seconds(usage)}
            )
            + "\n"
        )
    replies.flush()


def _become(spec):
  """Turn this forked child into `python *spec["argv"]` (after the interpreter's start)."""
  os.chdir(spec["cwd"])
  os.environ.clear()
  os.environ.update(spec["env"])
  for fd, path, mode in (
      (0, spec["stdin"], os.O_RDONLY),
      (1, spec["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
      (2, spec["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
  ):
    if fd == 2 and path == spec["stdout"]:  # stderr merged into stdout: one offset for both
      os.dup2(1, 2)
      continue
    opened = os.open(path, mode, 0o644)
    os.dup2(opened, fd)
    os.close(opened)
  if "numpy" in sys.modules:  # a new interpreter's global generator starts from fresh entropy
    sys.modules["numpy"].random.seed()
  argv = spec["argv"]
  import runpy

  if argv[0] == "-m":
    sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0]
    sys.path[0] = os.getcwd()
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
  elif argv[0] == "-c":
    sys.argv = ["-c", *argv[2:]]
    sys.path[0] = ""
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    exec(compile(argv[1], "<string>", "exec"), main.__dict__)
  else:
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
  # The protocol has fds of its own: what the imports or a child print cannot garble it.
  requests = os.fdopen(os.dup(0), "r")
  replies = os.fdopen(os.dup(1), "w")
  null = os.open(os.devnull, os.O_RDWR)
  os.dup2(null, 0)
  os.dup2(2, 1)
  _preload()
  # conftest's garbage-collection thresholds (fewer collections while JAX traces), and the
  # imports' objects left out of every collection: they live as long as the process
  gc.set_threshold(50_000, 20, 20)
  gc.freeze()
  replies.write(
      json.dumps({"ready": True, "cpu_s": _cpu_seconds(resource.getrusage(resource.RUSAGE_SELF))})
      + "\n"
  )
  replies.flush()
  child = _serve(requests, replies)
  if child is not None:
    _become(child)
