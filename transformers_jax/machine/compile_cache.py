"""JAX's persistent compilation cache: compiled programs kept on disk, so that a rerun or a
resume of the same configuration skips compilation.

Where it lives, first that applies: `--compile_cache_dir`; the JAX_COMPILATION_CACHE_DIR
environment variable; <user cache dir>/transformers_jax/jax ($XDG_CACHE_HOME, else ~/.cache).
`--compile_cache_dir=off` turns it off.

Beside it, `ReportCache`: `--fit`'s JSON file of compile reports (train/fit.py), one per
configuration, so a search run again compiles nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

OFF = "off"


def default_dir() -> pathlib.Path:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "transformers_jax" / "jax"


def enable(directory: str = "") -> str | None:
  """Point JAX's compilation cache at `directory` (see the module docstring for the default);
  returns the folder in use, or None when turned off. Call it before anything compiles."""
  import jax

  if directory.strip().lower() == OFF:  # off, OFF, Off: never a folder named so
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  path = directory or jax.config.jax_compilation_cache_dir or str(default_dir())
  try:
    pathlib.Path(path).mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ValueError(
        f"compile cache folder {path!r} cannot be created ({e.strerror or e}): pass a writable "
        f"--compile_cache_dir, or --compile_cache_dir={OFF}"
    ) from None
  jax.config.update("jax_compilation_cache_dir", str(path))
  return str(path)


def report_cache_path() -> pathlib.Path:
  """The default file of `ReportCache`: fit.json beside JAX's cache folder."""
  return default_dir().parent / "fit.json"


class ReportCache:
  """{key: compile report} in one JSON file (`path`; None: the default; "off": kept in memory
  only), written whole and atomically after each new report. No pickle: reports are JSON."""

  def __init__(self, path: str | None = None):
    if path == OFF:
      self.path = None
    else:
      self.path = pathlib.Path(os.path.expanduser(path)) if path else report_cache_path()
    self.entries = {}
    if self.path and self.path.exists():
      try:
        self.entries = json.loads(self.path.read_text())
      except ValueError:  # a damaged file: start again
        self.entries = {}

  def get(self, key: str):
    return self.entries.get(key)

  def put(self, key: str, report: dict) -> None:
    self.entries[key] = report
    if not self.path:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = self.path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(self.entries, indent=0, default=str))
    tmp.replace(self.path)


def report_key(config, devices) -> str:
  """What a compile's report depends on: the whole config, the devices compiled for and the
  compiler's version."""
  import jax
  import jaxlib

  where = config.mesh.get("topology", "") or f"{len(devices)} x {devices[0].device_kind}"
  text = json.dumps(
      [config.to_dict(), where, jax.__version__, jaxlib.__version__, _libtpu_version()],
      sort_keys=True,
      default=str,
  )
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def _libtpu_version() -> str:
  try:
    from importlib.metadata import version

    return version("libtpu")
  except Exception:  # noqa: BLE001 - not installed
    return ""
