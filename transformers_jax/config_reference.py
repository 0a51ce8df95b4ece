"""The config reference: every field of an experiment config, its default and its meaning.

The meanings are the comments beside the fields in the source (ModelConfig's field comments in
config/model.py, training_fields() in train_config.py, experiment_config() for `published`),
read with ast and tokenize, so there is one copy of each meaning. docs/config.md is generated from them:

    python -m transformers_jax.config_reference --out docs/config.md

and `--config_help` (on every command that takes --config) prints the same list for one config,
with its values beside the defaults. The registries' entries (position schemes, placements,
norm kinds, activations, objectives ...) are listed from the registries themselves, each with
its one-line summary; the same lists fill the marked sections of README.md and
docs/architecture.md:

    python -m transformers_jax.config_reference --sections
"""

from __future__ import annotations

import ast
import inspect
import io
import pathlib
import re
import sys
import textwrap
import tokenize
from typing import Any

from transformers_jax import config as config_lib
from transformers_jax import train_config
from transformers_jax.data.fields import add_data_fields
from transformers_jax.modules.common import summary_of
from transformers_jax.tasks import TASKS, registry_lines

DOC_PATH = "docs/config.md"
REGENERATE = f"python -m transformers_jax.config_reference --out {DOC_PATH}"
# the pages whose marked sections list the registries' entries (fill_sections)
SECTION_PAGES = ("README.md", "docs/architecture.md")
REGENERATE_SECTIONS = "python -m transformers_jax.config_reference --sections"


def _comments(source: str) -> tuple[dict[int, str], dict[int, str]]:
  """(trailing, full-line) comments of `source` by 1-based line: a trailing comment follows code
  on its line, a full-line comment stands alone."""
  trailing, whole = {}, {}
  lines = source.splitlines()
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type != tokenize.COMMENT:
      continue
    row, col = tok.start
    text = tok.string.lstrip("#").strip()
    (whole if not lines[row - 1][:col].strip() else trailing)[row] = text
  return trailing, whole


class _Meanings:
  """Finds the comment that documents a statement spanning lines [first, last]: a trailing
  comment on one of its lines, else the block of full-line comments right above it."""

  def __init__(self, source: str):
    self.trailing, self.whole = _comments(source)

  def __call__(self, first: int, last: int) -> str:
    own = [self.trailing[n] for n in range(first, last + 1) if n in self.trailing]
    if own:  # and a parenthesised remark on the full lines right below continues it
      n = last + 1
      while self.whole.get(n, "").startswith("("):
        own.append(self.whole[n])
        n += 1
      return " ".join(own)
    block, n = [], first - 1
    while n in self.whole:
      block.insert(0, self.whole[n])
      n -= 1
    return " ".join(block)


def _source(obj) -> tuple[ast.AST, _Meanings]:
  source = textwrap.dedent(inspect.getsource(obj))
  return ast.parse(source), _Meanings(source)


def _attribute_path(node: ast.AST) -> list[str] | None:
  """`c.data.path` -> ["data", "path"] (the root name dropped); None for anything else."""
  names = []
  while isinstance(node, ast.Attribute):
    names.insert(0, node.attr)
    node = node.value
  return names if isinstance(node, ast.Name) and names else None


def _assigned_meanings(function) -> dict[str, str]:
  """Meanings of the fields a config-building function assigns: `c.x = v  # meaning`, and the
  keys of a ConfigDict({...}) literal assigned to a field (`"key": v,  # meaning`)."""
  tree, meaning = _source(function)
  found = {}
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
      continue
    path = _attribute_path(node.targets[0])
    if path is None:
      continue
    name = ".".join(path)
    value = node.value
    literal = value.args[0] if isinstance(value, ast.Call) and value.args else None
    if isinstance(literal, ast.Dict):  # the comment above the field, its keys their own
      found[name] = meaning(node.lineno, node.lineno)
      for key in literal.keys:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
          found[f"{name}.{key.value}"] = meaning(key.lineno, key.end_lineno)
    else:
      found[name] = meaning(node.lineno, node.end_lineno)
  return found


def model_meanings() -> dict[str, str]:
  """ModelConfig's field comments, by field name."""
  tree, meaning = _source(config_lib.ModelConfig)
  (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
  return {
      node.target.id: meaning(node.lineno, node.end_lineno)
      for node in cls.body
      if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
  }


def meanings() -> dict[str, str]:
  """Every documented field of an experiment config by dotted name (`model.d_model`,
  `data.path`, `rules` for the whole group ...)."""
  found = _assigned_meanings(train_config.training_fields)
  found.update(_assigned_meanings(add_data_fields))  # the `data` group, data/fields.py
  found.update(
      {k: v for k, v in _assigned_meanings(train_config.experiment_config).items() if k != "model"}
  )
  found.update({f"model.{k}": v for k, v in model_meanings().items()})
  for field, names in config_lib.choices().items():  # from the registries: never stale
    found[f"model.{field}"] += f"; one of {' | '.join(names)}"
  for name, task in TASKS.items():  # each objective's own fields (Task.config_defaults)
    if task.config_defaults() is not None:
      own = _assigned_meanings(type(task).config_defaults)
      found.update({f"{name}.{k}": v for k, v in own.items()})
  return found


def meaning_of(name: str, table: dict[str, str]) -> tuple[str, str]:
  """(meaning, where it is written): a field's own meaning, else that of the nearest group above
  it that has one (the fields of `rules` are documented once, for the group)."""
  parts = name.split(".")
  for n in range(len(parts), 0, -1):
    where = ".".join(parts[:n])
    if table.get(where):
      return table[where], where
  return "", name


def flatten(config) -> dict[str, Any]:
  """A ConfigDict's leaves by dotted name, in the config's order."""
  out = {}
  for key, value in config.items():
    if hasattr(value, "items"):
      out.update({f"{key}.{k}": v for k, v in flatten(value).items()})
    else:
      out[key] = value
  return out


def default_config():
  """An experiment config with every field at the library's default."""
  return train_config.experiment_config()


def rows(config=None) -> list[tuple[str, Any, Any, str, str]]:
  """(field, value in `config`, library default, meaning, where the meaning is written: the field
  itself or its group) for every field of `config` (the defaults themselves when None)."""
  defaults = flatten(default_config())
  values = defaults if config is None else flatten(config)
  table = meanings()
  return [(k, v, defaults.get(k), *meaning_of(k, table)) for k, v in values.items()]


def _shown(value) -> str:
  return "unset" if value is None else repr(value)


def help_text(config, name: str = "") -> str:
  """What --config_help prints: one line per field, its value in this config, its default when
  the config changes it, and its meaning (a group's meaning once, above its fields)."""
  lines = ["Objectives (--config.task=NAME; empty: the model's own):"]
  lines += [f"    {line}" for line in registry_lines()]
  lines += ["", f"Fields of {name or 'the config'} (override with --config.FIELD=VALUE):", ""]
  said = set()
  for field, value, default, meaning, where in rows(config):
    if where != field and where not in said:
      said.add(where)
      lines.append(f"  {where}.*: {meaning}")
    changed = "" if value == default else f" (default {_shown(default)})"
    lines.append(f"  {field} = {_shown(value)}{changed}")
    if meaning and where == field:
      lines.append(f"      {meaning}")
    if field.startswith("model."):  # (the objectives are listed above)
      lines += [f"        {n}: {summary}" for n, summary in entry_summaries(field).items()]
  return "\n".join(lines)


def entry_summaries(field: str) -> dict[str, str]:
  """{name: one-line summary} of the registry behind `field` (`model.positions`, `task`, ...),
  in the registry's order; empty for a field that no registry backs."""
  if field == "task":
    return {name: summary_of(task) for name, task in TASKS.items()}
  registry = config_lib.registries().get(field.removeprefix("model."), {})
  return {name: summary_of(entry) for name, entry in registry.items()}


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def markdown() -> str:
  """docs/config.md: every field at its library default, with its meaning."""
  out = [
      "# Config reference",
      "",
      f"Generated by `{REGENERATE}` from the comments beside the fields in",
      "`transformers_jax/config/model.py` (`ModelConfig`, the `model.*` fields) and",
      "`transformers_jax/train_config.py` (the training fields); a test keeps it current. For one",
      "preset's values next to these defaults:",
      "`python -m transformers_jax.train --config experiments/gpt2.py:tiny --config_help`.",
      "Override any field with `--config.FIELD=VALUE`; `unset` fields take the value their meaning",
      "names.",
      "",
      "| field | default | meaning |",
      "|---|---|---|",
  ]
  said = set()
  for field, _, default, meaning, where in rows():
    if where != field and where not in said:
      said.add(where)
      out.append(f"| `{where}.*` | | {_cell(meaning)} |")
    shown = meaning if where == field else f"see `{where}.*`"
    out.append(f"| `{field}` | `{_cell(_shown(default))}` | {_cell(shown)} |")
  out += ["", "## The names a field takes from a registry", ""]
  for field in ["task"] + [f"model.{f}" for f in config_lib.registries()]:
    out += [f"`{field}`:", "", entry_table(field), ""]
  return "\n".join(out[:-1]) + "\n"


def entry_table(field: str) -> str:
  """A markdown table of the registry behind `field`: each name and its summary (objectives:
  with the families and heads they train)."""
  if field == "task":
    rows = ["| name | trains | what it is |", "|---|---|---|"]
    for name, task in TASKS.items():
      trains = ", ".join(task.families) or "any family"
      trains += f" (head {', '.join(task.heads)})" if task.heads else ""
      rows.append(f"| `{name}` | {_cell(trains)} | {_cell(summary_of(task))} |")
    return "\n".join(rows)
  rows = ["| name | what it is |", "|---|---|"]
  rows += [f"| `{n}` | {_cell(summary)} |" for n, summary in entry_summaries(field).items()]
  return "\n".join(rows)


# <!-- registry:FIELD --> ... <!-- /registry:FIELD -->: the table of FIELD's registry (lines of
# their own); <!-- names:FIELD -->...<!-- /names:FIELD -->: its names in a sentence.
_SECTION = re.compile(r"<!-- (registry|names):([\w.]+) -->(.*?)<!-- /\1:\2 -->", re.S)


def fill_sections(text: str) -> str:
  """`text` with every marked section holding its registry's entries as they stand."""

  def fill(match):
    kind, field = match.group(1), match.group(2)
    if kind == "names":
      body = ", ".join(f"`{name}`" for name in entry_summaries(field))
    else:
      body = f"\n{entry_table(field)}\n"
    return f"<!-- {kind}:{field} -->{body}<!-- /{kind}:{field} -->"

  return _SECTION.sub(fill, text)


def main(argv: list[str]) -> int:
  if argv[:1] == ["--out"] and len(argv) == 2:
    with open(argv[1], "w") as f:
      f.write(markdown())
    return 0
  if argv == ["--sections"]:  # from the checkout's root
    for page in map(pathlib.Path, SECTION_PAGES):
      page.write_text(fill_sections(page.read_text()))
    return 0
  if argv:
    print(
        f"error: unexpected arguments {argv}: give --out FILE, --sections, or none",
        file=sys.stderr,
    )
    return 2
  sys.stdout.write(markdown())
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
