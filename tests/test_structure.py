"""The package's shape: no import cycles among its modules (at module level or inside
functions), no private name imported from another module, no file over 400 lines, at most 10
modules at the package root, and every import pointing down the layers of docs/architecture.md."""

import ast
import functools
import pathlib

from conftest import ROOT

PACKAGE = ROOT / "transformers_jax"


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports():
  """{module: [(imported module, names taken from it, line)]} of every import of a package
  module anywhere in each file (functions included)."""
  return walk_imports(ROOT, PACKAGE)


@functools.cache
def walk_imports(root: pathlib.Path, package: pathlib.Path):
  """package_imports of the package at `package` under `root`, parsed once per test run."""
  modules = {module_name(p): p for p in package.rglob("*.py")}
  out = {}
  for name, path in modules.items():
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        found += [(a.name, [], node.lineno) for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [a.name for a in node.names]
        # `from pkg import module` imports the module; `from module import name` the module
        for a in names:
          if f"{node.module}.{a}" in modules:
            found.append((f"{node.module}.{a}", [], node.lineno))
        found.append(
            (node.module, [a for a in names if f"{node.module}.{a}" not in modules], node.lineno)
        )
    out[name] = [(m, names, line) for m, names, line in found if m in modules and m != name]
  return out, modules


def test_no_import_cycles():
  imports, _ = package_imports()
  graph = {m: sorted({target for target, _, _ in found}) for m, found in imports.items()}
  state, stack, cycles = {}, [], []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for n in graph.get(m, []):
      if n.startswith(m + "."):  # a package importing its own submodule is how packages work
        continue
      if state.get(n) == "open":
        cycles.append(stack[stack.index(n) :] + [n])
      elif n not in state:
        visit(n)
    stack.pop()
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m)
  # a submodule importing names its package re-exports is no cycle of code: drop edges into a
  # package's __init__ from its own submodules before judging
  real = [c for c in cycles if not any(b.startswith(a + ".") for a, b in zip(c, c[1:]))]
  assert not real, "import cycles: " + "; ".join(" -> ".join(c) for c in real)


def test_no_private_names_cross_modules():
  imports, _ = package_imports()
  crossing = [
      f"{m}:{line} imports {name} from {target}"
      for m, found in imports.items()
      for target, names, line in found
      for name in names
      if name.startswith("_") and not name.startswith("__")
  ]
  assert not crossing, "\n".join(crossing)


def test_no_file_over_400_lines():
  long = {
      str(p.relative_to(ROOT)): n
      for p in PACKAGE.rglob("*.py")
      if (n := len(p.read_text().splitlines())) > 400
  }
  assert not long, long


def test_the_package_root_holds_at_most_10_modules():
  """The root holds the commands and what everything shares; the rest lives in the packages
  whose names say what they are (docs/architecture.md)."""
  root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
  assert len(root_modules) <= 10, root_modules


# The layers of docs/architecture.md, bottom first: a module imports from its own layer and
# those below it, never from a layer above. A module belongs to the layer of the longest prefix
# of its dotted name (within the package) listed here; the package root itself is in the first.
LAYERS = [
    ("base", ["", "errors", "records", "machine"]),
    ("model definition", ["config", "modules"]),
    ("models", ["models"]),
    ("data", ["data"]),
    # train_config's checks ask the run's objective (Task.check), and every config holds the
    # objectives' own fields (Task.config_defaults): it sits with the objectives
    ("objectives and decoding", ["tasks", "decode", "interop", "train_config"]),
    ("run folder", ["run_folder"]),
    # the harness (lm-eval) runs on finished runs and during training: beside the training
    ("training", ["train", "evaluate"]),
    (
        "commands",
        ["train.__main__", "evaluate.__main__", "cli", "config_reference", "scripting"]
        + ["generate", "convert", "compare", "param_count"],
    ),
]


def layer_of(module: str) -> int:
  """The index in LAYERS of `module` (a dotted name starting with the package's)."""
  inner = module.partition(".")[2]
  best = None
  for index, (_, prefixes) in enumerate(LAYERS):
    for prefix in prefixes:
      if (
          inner == prefix
          or (prefix and inner.startswith(prefix + "."))
          or (not prefix and not inner)
      ):
        if best is None or len(prefix) > best[0]:
          best = (len(prefix), index)
  assert best is not None, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
  return best[1]


def test_imports_point_down_the_layers():
  imports, _ = package_imports()
  upward = [
      f"{m}:{line} ({LAYERS[layer_of(m)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
      for m, found in imports.items()
      for target, _, line in found
      if layer_of(target) > layer_of(m)
  ]
  assert not upward, "\n".join(upward)
  assert layer_of("transformers_jax.train.__main__") > layer_of("transformers_jax.train.loop")
  assert layer_of("transformers_jax.records") == 0  # beside errors.py: everything may use it


def test_the_checks_see_a_cycle_and_a_private_import(tmp_path, monkeypatch):
  """The walkers find what they look for (a fake package with both faults)."""
  fake = tmp_path / "transformers_jax"
  fake.mkdir()
  (fake / "__init__.py").write_text("")
  (fake / "a.py").write_text("def f():\n  from transformers_jax.b import _hidden\n")
  (fake / "b.py").write_text("from transformers_jax import a\n_hidden = 1\n")
  monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
  monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
  imports, _ = package_imports()
  assert ("transformers_jax.b", ["_hidden"], 2) in imports["transformers_jax.a"]
  assert ("transformers_jax.a", [], 1) in imports["transformers_jax.b"]
  import pytest

  with pytest.raises(AssertionError, match="a -> transformers_jax.b -> transformers_jax.a"):
    test_no_import_cycles()
  with pytest.raises(AssertionError, match="imports _hidden"):
    test_no_private_names_cross_modules()
