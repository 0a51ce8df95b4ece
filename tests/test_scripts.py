"""Every script in scripts/ starts one way (its own ScriptFlags, `main(argv)`, cli.run_script),
lists its flags with --helpfull, and answers a bad flag value with one `error:` line, exit 2."""

import ast
import contextlib
import importlib.util
import io
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env

SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py"))


def load(name):
  spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # as an import does: dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def dotted(node) -> str:
  parts = []
  while isinstance(node, ast.Attribute):
    parts.insert(0, node.attr)
    node = node.value
  return ".".join([node.id, *parts]) if isinstance(node, ast.Name) else ""


def test_there_are_scripts():
  assert {"bench_decode", "bench_train", "count_params", "plan_scale"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_starts_through_the_shared_helper(name):
  tree = ast.parse((ROOT / "scripts" / f"{name}.py").read_text())
  (guard,) = [n for n in tree.body if isinstance(n, ast.If) and "__name__" in ast.unparse(n.test)]
  assert [ast.unparse(s) for s in guard.body] == ["cli.run_script(main)"]
  assigned = {
      ast.unparse(n.targets[0]): ast.unparse(n.value)
      for n in tree.body
      if isinstance(n, ast.Assign)
  }
  assert assigned.get("FLAGS") == "cli.ScriptFlags(__doc__)"
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      called = dotted(node.func)
      assert called not in ("sys.path.insert", "sys.path.append", "app.run"), called
    if isinstance(node, ast.Attribute):
      assert dotted(node) not in ("sys.argv", "flags.FLAGS"), "flags come from main(argv)"
    if isinstance(node, (ast.Assign, ast.AugAssign)):  # no monkey-patched private names
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        if isinstance(target, ast.Attribute):
          assert not target.attr.startswith("_"), ast.unparse(target)


@pytest.mark.parametrize("name", SCRIPTS)
def test_helpfull_lists_every_flag(name):
  module = load(name)
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
    module.main(["--helpfull"])
  assert done.value.code == 0
  text = out.getvalue()
  assert text.startswith(module.__doc__.strip().splitlines()[0])
  for flag in module.FLAGS:
    assert f"--{flag}" in text or f"--[no]{flag}" in text, flag


@pytest.mark.parametrize(
    "script, args, said",
    [
        ("bench_decode", ["--positions=abc"], "--positions=abc"),
        ("bench_decode", ["--positions=5000", "--max_len=2048"], "--max_len=2048"),
        ("bench_model", ["--layers=abc"], "--layers=abc"),
        ("packing_density", ["--seq_len", "0"], "--seq_len=0"),
        ("count_params", ["--jsn"], "unknown flag --jsn"),
    ],
)
def test_a_bad_flag_value_is_one_error_line(script, args, said):
  done = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / f"{script}.py"), *args],
      capture_output=True,
      text=True,
      cwd=ROOT,
      env=subprocess_env(),
  )
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
  assert lines[0].startswith("error: ") and said in lines[0]
