"""Experiment configs as files and ConfigDicts: every ModelConfig field as a ConfigDict (the
`model` group of an experiment config), and an experiments/*.py file imported by path."""

from __future__ import annotations

import dataclasses

import ml_collections

from transformers_jax.config.model import ModelConfig


def model_config_dict(**overrides) -> ml_collections.ConfigDict:
  """A ConfigDict holding every ModelConfig field at its default, then `overrides`.

  Fields whose default is None are given a placeholder type so that command-line overrides such
  as `--config.model.num_kv_heads=2` type-check.
  """
  base = ModelConfig().to_dict()
  # "int | None" -> int: the type a derived (None) field takes when set
  kinds = {
      f.name: {"int": int, "bool": bool, "float": float, "str": str}[str(f.type).split(" |")[0]]
      for f in dataclasses.fields(ModelConfig)
  }
  d = ml_collections.ConfigDict()
  for name, value in base.items():
    if value is None:
      setattr(d, name, ml_collections.config_dict.placeholder(kinds[name]))
    else:
      setattr(d, name, value)
  for name, value in overrides.items():
    if name not in base:
      raise ValueError(f"model.{name}: unknown field")
    setattr(d, name, value)
  return d


def load_config_module(path: str):
  """Import an experiments/*.py config file by path (as absl's config_flags does)."""
  import importlib.util
  import pathlib

  p = pathlib.Path(path)
  if not p.is_file():
    raise FileNotFoundError(f"config file {path} does not exist")
  spec = importlib.util.spec_from_file_location(p.stem, p)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
