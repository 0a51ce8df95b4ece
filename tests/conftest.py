"""Test-wide setup: run JAX on the CPU and import the experiment config files by path."""

import os
import pathlib
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
