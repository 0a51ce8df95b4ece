"""What every command line shares: the --config and --cpu_devices flags, and one-line errors for a
user's mistakes."""

from __future__ import annotations

import functools
import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from transformers_jax.machine import hardware
from transformers_jax.errors import (
    EXIT_SAVED_AND_STOPPED,
    AbortedBeforeStart,
    Interrupted,
    InterruptedAfterRun,
    UserError,
)

FLAGS = flags.FLAGS
# (the library's own entries call it too, e.g. run_folder.runs.load_run: machine/hardware.py)
quiet_cpu_host = hardware.quiet_cpu_host


def define_config_flag(default: str | None = None, flag_values: flags.FlagValues = FLAGS) -> None:
  """--config, --cpu_devices and --config_help, in `flag_values` (a script's own, or absl's)."""
  config_flags.DEFINE_config_file(
      "config",
      default,
      "Experiment config, e.g. experiments/gpt2.py:small; override fields with "
      "--config.model.num_layers=24 and the like.",
      flag_values=flag_values,
      lock_config=True,
  )
  flags.DEFINE_integer(
      "cpu_devices",
      0,
      "Split this host's CPU into N JAX devices (0: JAX's default, one), which the mesh then "
      "spans like any others. On a CPU, N=2 runs two halves of each batch side by side, so one "
      "half's memory-bound operations overlap the other's matmuls (about 5% faster on two "
      "cores). Accelerators are unaffected.",
      flag_values=flag_values,
  )
  flags.DEFINE_bool(
      "config_help",
      False,
      "Print every field of --config (model and training): its value, its default and its "
      "meaning, then exit. docs/config.md lists the defaults.",
      flag_values=flag_values,
  )


def apply_cpu_devices(flag_values: flags.FlagValues = FLAGS) -> None:
  """--cpu_devices, applied before JAX starts its backends (which fixes the device count)."""
  n = flag_values["cpu_devices"].value if "cpu_devices" in flag_values else 0
  if n < 0:
    raise UserError(
        f"--cpu_devices={n}: give a positive number of devices, or 0 for JAX's " "default"
    )
  if n:
    import jax

    try:
      jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:  # the backends already started
      raise UserError(f"--cpu_devices={n}: JAX has already started ({e})") from None


def quiet_children() -> None:
  """Python's resource tracker (a process of its own, started with the data workers) reports the
  shared memory a killed worker left, which it then frees, in three lines of warning after the
  run's own error line; hide that report, unless the user set PYTHONWARNINGS. (The batches of
  workers that end normally leave nothing behind: data/pipeline.py.)"""
  os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")


def _one_line_errors(call):
  """call() with a user's mistake as one 'error: ...' line and exit code 2, a run a signal
  stopped after saving as one line and exit code 75, Ctrl-C as one line and exit code 130
  (transformers_jax/errors.py lists the codes)."""
  try:
    return call()
  except (AbortedBeforeStart, InterruptedAfterRun) as e:  # no interpreter shutdown: see errors
    print(f"error: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2 if isinstance(e, AbortedBeforeStart) else EXIT_SAVED_AND_STOPPED)
  except Interrupted as e:  # saved: run again to resume
    print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_SAVED_AND_STOPPED)
  except (UserError, ValueError, FileNotFoundError) as e:  # DataError is a ValueError
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except OSError as e:  # a workdir that is a file, a read-only folder, a full disk ...
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    print(
        f"error: {e.strerror or e}{where}: check the path's type, permissions and free space",
        file=sys.stderr,
    )
    sys.exit(2)
  except KeyboardInterrupt:
    print("error: interrupted (Ctrl-C)", file=sys.stderr)
    sys.exit(130)
  except RuntimeError as e:
    if not _DATA_WORKER_DIED.search(str(e)):
      raise
    code = re.search(r"exit code (-?\d+)", str(e))
    print(
        "error: a data worker process ended unexpectedly"
        + (f" (exit code {code.group(1)})" if code else "")
        + ": run the same command again to resume from the last checkpoint; "
        "--config.data.workers=0 computes batches in the training process",
        file=sys.stderr,
    )
    sys.exit(2)


# grain's error when one of its worker processes dies (killed, out of memory)
_DATA_WORKER_DIED = re.compile(r"[Ww]orker process was terminated unexpectedly")


def _console_quiet(flag_values: flags.FlagValues = FLAGS) -> None:
  if "verbosity" not in flag_values or not flag_values["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; keep the console


def user_errors(main, start_backends: bool = True):
  """Wrap an absl main: a UserError, ValueError or OSError becomes one 'error: ...' line and
  exit code 2."""

  @functools.wraps(main)
  def wrapped(argv):
    _console_quiet()

    def call():
      apply_cpu_devices()
      if start_backends:  # (train starts them itself, after joining a multi-process cluster)
        hardware.start_backends()
      return main(argv)

    return _one_line_errors(call)

  return wrapped


def parse_ids(text: str, flag: str) -> list[int]:
  """Comma-separated token ids given to --flag."""
  try:
    return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
  except ValueError:
    raise UserError(f"--{flag}={text!r}: give comma-separated integers, e.g. 1,2,3") from None


def _gist(text: str) -> str:
  """The last line of an error text that says something, without a traceback's class prefix."""
  text = text.strip().strip("'\"").replace("\\n", "\n")
  lines = [line.strip().strip("'\"") for line in text.splitlines() if line.strip()]
  said = [line for line in lines if re.match(r"^\w+(Error|Exception): ", line)]
  line = said[-1] if said else (lines[-1] if lines else "")
  return re.sub(r"^\w+(Error|Exception): ", "", line)


# The import line of the config.py that convert wrote into a converted model's folder before
# experiment-config assembly moved to train_config.py.
OLD_CONVERTED_CONFIG = "from transformers_jax.config import config_from_json"


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[\d+\])?")  # (an element of a tuple field)
_FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _read_text(path: str) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return f.read(100_000)
  except OSError:
    return ""


def _unknown_override(error: str, overrides: list[str]) -> str:
  """The --config.x.y override that `error` is about. ml_collections quotes the unknown name
  ('y', or 'x' when a whole section is unknown): the first override with that part in its name,
  leaving out the field a "Did you mean" hint suggests; else the last override."""
  error = error.replace("\\'", "'").split("Did you mean")[0]
  for name in overrides:
    parts = name[len("--config.") :].split(".")
    if any(re.search(f"['\"]{re.escape(part)}['\"]", error) for part in parts):
      return name
  return overrides[-1] if overrides else "--config"


def _parse(flag_values: flags.FlagValues, argv) -> tuple[list[str], str | None]:
  """Parse `argv` (program name first) into `flag_values`: (the program name and positional
  arguments, None), or ([], the one line that says what is wrong: a flag's bad value, or in
  --config a missing file, an unknown preset or field, a value of the wrong type)."""
  overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
  for name in overrides:  # (ml_collections would fail on these with a traceback)
    parts = name[len("--config.") :].split(".")
    if not all(_FIELD_NAME.fullmatch(p) for p in parts):
      fixed = ".".join(p.replace("-", "_") for p in parts)
      hint = f" (did you mean --config.{fixed}?)" if _FIELD_PATH.fullmatch(fixed) else ""
      return [], (
          f"{name}: no such config field{hint}: field names are Python names, with "
          "underscores; --config_help lists the fields"
      )
  try:
    rest = flag_values(argv)
    if "config" in flag_values and flag_values["config"].value is not None:
      flag_values.config.keys()  # a config file that failed to load raises here, not in parsing
    return rest, None
  except (AttributeError, KeyError) as e:  # an override of a field the config does not have
    said = str(e).replace("\\n", " ").replace("\\'", "").strip("'\" ")
    name = _unknown_override(str(e), overrides)
    hint = re.search(r"Did you mean .*\?", said)
    message = f"{name}: no such config field" + (f" ({hint.group(0)})" if hint else "")
    return [], message + "; --config_help lists the fields (docs/config.md the defaults)"
  except (OSError, ImportError, SyntaxError, NameError) as e:  # the file cannot be read or run
    given = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
    if given is None and "--config" in argv[:-1]:
      given = argv[argv.index("--config") + 1]
    path = (given or "").split(":")[0]
    if OLD_CONVERTED_CONFIG in _read_text(path):
      return [], (
          f"--config: {path!r} was written by an older convert, whose config_from_json now "
          f"lives in transformers_jax.train_config: change its line '{OLD_CONVERTED_CONFIG}' "
          "to 'from transformers_jax.train_config import config_from_json'"
      )
    said = str(e).strip().splitlines()
    reason = f"{type(e).__name__}: {said[-1]}" if said else type(e).__name__
    if isinstance(e, OSError) and not os.path.exists(path):
      reason = "no such file"
    return [], (
        f"--config: cannot load {path!r} ({reason}): give an experiment file (Python, with "
        "get_config), e.g. --config experiments/gpt2.py:cpu"
    )
  except flags.UnrecognizedFlagError as e:
    return [], f"unknown flag --{e.flagname}: --helpfull lists the flags"
  except flags.Error as e:
    return [], _gist(str(e))


def parse_flags(argv):
  """absl's flag parsing for the package's commands, a user's mistake as one `error:` line and
  exit code 2; --config_help prints the config's fields and exits."""
  quiet_cpu_host()
  quiet_children()
  rest, message = _parse(FLAGS, argv)
  if message is not None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
  if "config_help" in FLAGS and FLAGS.config_help:
    print_config_help(FLAGS)
  message = unread_setting_given(FLAGS)
  if message is not None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
  return rest


def unread_setting_given(flag_values: flags.FlagValues) -> str | None:
  """The line refusing a model setting given on the command line that the model never reads
  (a norm field under a placement without norms, modules/norms.py), or None. The same setting
  from a config file, where a preset sets it for every placement, is only noted
  (train/field_checks.py)."""
  if "config" not in flag_values or flag_values["config"].value is None:
    return None
  given = config_flags.get_override_values(flag_values["config"])
  from transformers_jax.config import ModelConfig
  from transformers_jax.modules.norms import unread_norm_fields

  try:
    cfg = ModelConfig.from_dict(flag_values.config.model)
  except (ValueError, TypeError, AttributeError):  # refused with its own line where it is built
    return None
  for field, why, fix in unread_norm_fields(cfg):
    if f"model.{field}" in given:
      return f"model.{field}={getattr(cfg, field)!r}: {why}: {fix}"
  return None


def print_config_help(flag_values: flags.FlagValues = FLAGS) -> None:
  """--config_help: every field of --config (or of the defaults), then exit 0."""
  from transformers_jax import config_reference

  given = flag_values["config"].value
  if given is None:
    print(config_reference.markdown())
  else:
    print(config_reference.help_text(given, flag_values["config"].config_filename))
  sys.exit(0)


def run(main, start_backends: bool = True) -> None:
  """The start of the package's commands (python -m transformers_jax.train and the like)."""
  app.run(user_errors(main, start_backends), flags_parser=parse_flags)


# ---------------------------------------------------------------------------------- scripts
# Every script in scripts/ starts the same way: its flags in a ScriptFlags of its own (so that
# scripts imported side by side, as the tests do, never clash), a `main(argv=None)` that begins
# with `args = cli.parse_script_flags(FLAGS, argv)`, and `cli.run_script(main)` under
# `if __name__ == "__main__"`.


class ScriptFlags(flags.FlagValues):
  """A script's own flags, with its docstring for --help."""

  def __init__(self, doc: str | None):
    super().__init__()
    self.__dict__["doc"] = (doc or "").strip()


def define_integer_list(
    name: str, default: str, help: str, flag_values: flags.FlagValues, lower_bound: int = 1
) -> None:
  """A flag holding comma-separated integers, each at least `lower_bound`; its value is a list
  of ints. A bad value is refused while parsing, as one line naming the flag."""

  def parse(text):
    items = text if isinstance(text, list) else [t for t in text.replace(" ", "").split(",")]
    try:
      values = [int(t) for t in items if t != ""]
    except ValueError:
      raise ValueError(
          f"give comma-separated integers (each >= {lower_bound}), e.g. {default}"
      ) from None
    if not values or min(values) < lower_bound:
      raise ValueError(f"every value must be an integer >= {lower_bound}, e.g. {default}")
    return values

  class IntegerList(flags.ArgumentParser):

    def parse(self, argument):
      return parse(argument)

    def flag_type(self):
      return "comma-separated integers"

  flags.DEFINE(IntegerList(), name, default, help, flag_values, flags.CsvListSerializer(","))


def help_text(flag_values: flags.FlagValues) -> str:
  """A script's docstring, then every flag it takes, with its default and meaning."""
  doc = getattr(flag_values, "doc", "") if isinstance(flag_values, ScriptFlags) else ""
  return (doc + "\n\n" if doc else "") + "flags:\n" + flag_values.get_help()


def parse_script_flags(
    flag_values: flags.FlagValues, argv: list[str] | None = None, program: str | None = None
) -> list[str]:
  """Parse a script's flags from `argv` (the arguments after the program name, which
  run_script passes; None = none: main() called from Python takes the defaults), every flag
  back at its default first, and apply --cpu_devices. Returns the positional arguments.
  --help / --helpfull print the script's docstring and flags and exit 0; --config_help prints
  the config's fields; a bad flag is one error line (a UserError)."""
  argv = [] if argv is None else list(argv)
  if any(a in ("-h", "--help", "-help", "--helpfull", "--helpshort") for a in argv):
    print(help_text(flag_values))
    sys.exit(0)
  flag_values.unparse_flags()
  rest, message = _parse(flag_values, [program or sys.argv[0], *argv])
  if message is not None:
    raise UserError(message)
  if "config_help" in flag_values and flag_values.config_help:
    print_config_help(flag_values)
  message = unread_setting_given(flag_values)
  if message is not None:
    raise UserError(message)
  apply_cpu_devices(flag_values)
  from transformers_jax.scripting import output_paths

  output_paths.check_declared(flag_values)  # before the work: a bad path is not found at the end
  return rest[1:]


def run_script(main) -> None:
  """The one start of every script: `main(sys.argv[1:])`, on the CPU alone where the host has no
  accelerator, with a user's mistake (a bad flag value included) as one `error:` line and exit
  code 2."""
  quiet_cpu_host()
  quiet_children()
  _console_quiet()
  sys.exit(_one_line_errors(lambda: main(sys.argv[1:])) or 0)
