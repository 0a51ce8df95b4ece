"""The paths a script writes its results to, checked when its flags are parsed, before any of
its work: a path that cannot be written (a folder given for a file, a file given for a folder,
a read-only or missing parent) is one `error:` line at once, not after minutes of work.

A script declares its output flags beside their definitions,

    flags.DEFINE_string("json", "", "Also write the result to this file.", flag_values=FLAGS)
    output_paths.declare(FLAGS, json=output_paths.FILE)

and cli.parse_script_flags checks every declared flag that holds a path."""

from __future__ import annotations

import os
import pathlib
import tempfile

from transformers_jax.errors import UserError

FILE, FOLDER = "file", "folder"


def declare(flag_values, **kinds: str) -> None:
  """Mark flags of `flag_values` as output paths: name=FILE (a file the script writes or
  appends to) or name=FOLDER (a folder it writes into, created when missing)."""
  for name, kind in kinds.items():
    if kind not in (FILE, FOLDER):
      raise ValueError(f"output path {name}: kind {kind!r} is not {FILE!r} or {FOLDER!r}")
  flag_values.__dict__.setdefault("output_paths", {}).update(kinds)


def check_declared(flag_values) -> None:
  """check() every declared output flag that holds a path."""
  for name, kind in flag_values.__dict__.get("output_paths", {}).items():
    value = flag_values[name].value
    if value:
      check(value, f"--{name}", kind)


def check(path, flag: str, kind: str) -> None:
  """Raise UserError unless `path` can be written as a `kind` (FILE or FOLDER)."""
  path = pathlib.Path(path).expanduser()
  if kind == FILE and path.is_dir():
    raise UserError(
        f"{flag}={path} is a folder: give the path of a file to write, e.g. "
        f"{flag}={path / 'result.json'}"
    )
  if kind == FOLDER and path.exists() and not path.is_dir():
    raise UserError(f"{flag}={path} is a file: give a folder (it is created when missing)")
  if kind == FILE and path.exists() and not os.access(path, os.W_OK):
    raise UserError(f"{flag}={path}: the file is not writable: give another path")
  folder = path if kind == FOLDER else path.parent
  existing = next((p for p in (folder, *folder.parents) if p.exists()), pathlib.Path("."))
  if not existing.is_dir():
    raise UserError(f"{flag}={path}: {existing} is a file, so no folder can be made there")
  try:  # a real write: os.access says yes to root even where the filesystem refuses
    with tempfile.TemporaryFile(dir=existing):
      pass
  except OSError as e:
    raise UserError(
        f"{flag}={path}: cannot write in {existing} ({e.strerror or e}): give a path in a "
        "folder you can write to"
    ) from None
