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

import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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
