"""The config reference: every field of every preset has a meaning read from the source, the
generated docs/config.md is current, and --config_help prints the fields of one config."""

import pytest

from conftest import ROOT, run_python, subprocess_env
from transformers_jax import config_reference
from transformers_jax.config import load_config_module

PRESET_FILES = ("gpt2", "gpt3", "bert", "transformer", "vit")


def test_the_generated_reference_is_current():
  written = (ROOT / config_reference.DOC_PATH).read_text()
  assert written == config_reference.markdown(), (
      f"{config_reference.DOC_PATH} is out of date with the field comments: regenerate it with "
      f"`{config_reference.REGENERATE}`"
  )


@pytest.mark.parametrize("page", config_reference.SECTION_PAGES)
def test_the_registries_lists_in_the_docs_are_current(page):
  """README.md's and docs/architecture.md's lists of placements, position schemes, norm kinds,
  activations, objectives ... are the registries' (their marked sections)."""
  written = (ROOT / page).read_text()
  assert "<!-- registry:" in written or "<!-- names:" in written
  assert written == config_reference.fill_sections(written), (
      f"{page}'s registry lists are out of date: regenerate them with "
      f"`{config_reference.REGENERATE_SECTIONS}`"
  )


@pytest.mark.parametrize("name", PRESET_FILES)
def test_every_field_of_every_preset_has_a_default_and_a_meaning(name):
  module = load_config_module(str(ROOT / "experiments" / f"{name}.py"))
  defaults = config_reference.flatten(config_reference.default_config())
  for preset in module.PRESETS:
    for field, _, _, meaning, _ in config_reference.rows(module.get_config(preset)):
      assert field in defaults, f"{name}.py:{preset}: {field} is not a config field"
      assert meaning, f"{field} has no comment beside it in the source"
  model_fields = [f for f in defaults if f.startswith("model.")]
  assert "model.d_model" in model_fields and len(model_fields) > 40


def test_meanings_come_from_the_comments_beside_the_fields():
  table = config_reference.meanings()
  assert table["model.d_model"] == "width of the residual stream (D)"
  assert table["steps"] == "optimizer updates (the schedule spans these)"
  assert table["data.path"].startswith("user data:")
  # a field of a group without a comment of its own takes the group's
  meaning, where = config_reference.meaning_of("rules.mlp", table)
  assert where == "rules" and "logical-axis rule overrides" in meaning


def test_config_help_lists_values_defaults_and_meanings():
  out = run_python(
      [
          "-m",
          "transformers_jax.train",
          "--config",
          "experiments/gpt2.py:tiny",
          "--config.steps=7",
          "--config_help",
      ],
      env=subprocess_env(),
  )
  assert out.returncode == 0 and not out.stderr, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  assert "  steps = 7 (default 1000)" in lines  # the override, beside the default
  at = lines.index("  model.d_model = 64")
  assert lines[at + 1].strip() == "width of the residual stream (D)"
  listed = {line.split(" = ")[0][2:] for line in lines if line.startswith("  ") and line[2] != " "}
  listed = {name for name in listed if not name.endswith(".*:") and ".*: " not in name}
  assert listed == set(config_reference.flatten(config_reference.default_config()))
