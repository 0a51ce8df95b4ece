"""The README is the front door and docs/ the reference: the quick start's two commands, links
that resolve, and commands that name what exists (presets, extras, run folders made by an
earlier command)."""

import re
import tomllib

import pytest

from conftest import ROOT
from transformers_jax.config import ModelConfig, load_config_module

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
QUICK_START = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m "
    "transformers_jax.train --config experiments/gpt2.py:cpu --workdir runs/quickstart",
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m pytest',
)


def commands(text: str) -> list[str]:
  """Every command of the fenced blocks and inline code, continuation lines joined."""
  text = text.replace("\\\n", " ")
  blocks = re.findall(r"```\n(.*?)```", text, re.S)
  lines = [line for block in blocks for line in block.splitlines()]
  return lines + re.findall(r"`([^`\n]+)`", text)


def test_the_readme_is_a_front_door_with_the_two_commands():
  text = README.read_text()
  assert len(text.splitlines()) <= 250
  start = text.index("## Quick start\n\n```\n") + len("## Quick start\n\n```\n")
  block = text[start : text.index("```", start)].strip().splitlines()
  assert block == list(QUICK_START)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
    if re.match(r"\w+://", target):
      continue
    path = (page.parent / target).resolve()
    assert path.exists(), f"{page.name}: link to {target} leads nowhere"


def all_commands() -> list[str]:
  return [c for page in PAGES for c in commands(page.read_text())]


def test_named_presets_exist():
  named = set()
  for command in all_commands():
    named |= set(re.findall(r"experiments/(\w+)\.py:([\w.\-]+)", command))
  assert ("bert", "classify") in named and ("gpt2", "cpu") in named
  for file, preset in sorted(named):
    module = load_config_module(str(ROOT / "experiments" / f"{file}.py"))
    assert preset in module.PRESETS, f"experiments/{file}.py has no preset {preset!r}"
    ModelConfig.from_dict(module.get_config(preset).model)  # a valid model (num_classes set ...)


def test_named_extras_exist():
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  named = set(re.findall(r'pip install -e "?\.\[(\w+)\]', "\n".join(all_commands())))
  assert "tensorboard" in named  # the TensorBoard command says what to install
  assert named <= set(extras), named - set(extras)
  assert any(r.startswith("tensorboard") for r in extras["tensorboard"])


def test_run_folders_read_by_a_command_are_made_by_one():
  made, read = set(), set()
  for command in all_commands():
    workdir = re.search(r"--workdir[ =](\S+)", command)
    if not workdir:
      continue
    if re.search(r"transformers_jax\.train\b|--from_hf", command):
      made.add(workdir.group(1))
    elif re.search(r"transformers_jax\.(generate|convert)\b", command):
      read.add(workdir.group(1))
  assert "runs/numbers" in read
  assert read <= made, f"no command in the docs makes {sorted(read - made)}"


def test_the_parameter_count_table_is_what_count_params_prints(monkeypatch):
  import contextlib
  import importlib.util
  import io

  from transformers_jax.models import counting

  # the analytic count, which tests/test_counting.py holds equal to eval_shape for every preset,
  # in a fraction of the time
  monkeypatch.setattr(counting, "count", counting.analytic_count)

  spec = importlib.util.spec_from_file_location("count_params", ROOT / "scripts/count_params.py")
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    script.main([])
  printed = [line for line in out.getvalue().splitlines() if line.startswith("|")]
  page = (ROOT / "docs" / "parameter_counts.md").read_text().splitlines()
  start = page.index(printed[0])
  assert page[start : start + len(printed)] == printed, "rerun python scripts/count_params.py"
