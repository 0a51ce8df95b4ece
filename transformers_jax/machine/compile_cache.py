"""JAX's persistent compilation cache: compiled programs kept on disk, so that a rerun or a
resume of the same configuration skips compilation.

Where it lives, first that applies: `--compile_cache_dir`; the JAX_COMPILATION_CACHE_DIR
environment variable; <user cache dir>/transformers_jax/jax ($XDG_CACHE_HOME, else ~/.cache).
`--compile_cache_dir=off` turns it off.
"""

from __future__ import annotations

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
