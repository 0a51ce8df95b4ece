"""What every command line shares: the --config and --cpu_devices flags, and one-line errors for a
user's mistakes."""

from __future__ import annotations

import functools
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS


def define_config_flag(default: str | None = None) -> None:
  config_flags.DEFINE_config_file(
      "config",
      default,
      "Experiment config, e.g. experiments/gpt2.py:small; override fields with "
      "--config.model.num_layers=24 and the like.",
      lock_config=True,
  )
  flags.DEFINE_integer(
      "cpu_devices",
      0,
      "Split this host's CPU into N JAX devices (0: JAX's default, one), which the mesh then "
      "spans like any others. On a CPU, N=2 runs two halves of each batch side by side, so one "
      "half's memory-bound operations overlap the other's matmuls (about 5% faster on two "
      "cores). Accelerators are unaffected.",
  )
  flags.DEFINE_bool(
      "config_help",
      False,
      "Print every field of --config (model and training): its value, its default and its "
      "meaning, then exit. docs/config.md lists the defaults.",
  )


def apply_cpu_devices() -> None:
  """--cpu_devices, applied before JAX starts its backends (which fixes the device count)."""
  n = FLAGS["cpu_devices"].value if "cpu_devices" in FLAGS else 0
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


class UserError(Exception):
  """A mistake in what the user asked for: printed as one line, exit code 2."""


def user_errors(main, start_backends: bool = True):
  """Wrap an absl main: a UserError, ValueError or OSError becomes one 'error: ...' line and
  exit code 2."""

  @functools.wraps(main)
  def wrapped(argv):
    if not FLAGS["verbosity"].present:  # orbax logs every save at INFO; keep the console for us
      logging.set_verbosity(logging.WARNING)
    try:
      apply_cpu_devices()
      if start_backends:  # (train starts them itself, after joining a multi-process cluster)
        from transformers_jax import hardware

        hardware.start_backends()
      return main(argv)
    except (UserError, ValueError, FileNotFoundError) as e:  # DataError is a ValueError
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except OSError as e:  # a workdir that is a file, a read-only folder, a full disk ...
      where = f" ({e.filename})" if getattr(e, "filename", None) else ""
      print(
          f"error: {e.strerror or e}{where}: check the path's type, permissions and free " "space",
          file=sys.stderr,
      )
      sys.exit(2)

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


def parse_flags(argv):
  """absl's flag parsing, with a user's mistakes in --config (a missing file, an unknown preset
  or field, a value of the wrong type) as one `error:` line and exit code 2."""
  overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
  try:
    rest = FLAGS(argv)
    if "config" in FLAGS and FLAGS["config"].value is not None:
      FLAGS.config.keys()  # a config file that failed to load raises here, not while parsing
    if "config_help" in FLAGS and FLAGS.config_help:
      print_config_help()
    return rest
  except (AttributeError, KeyError) as e:  # an override of a field the config does not have
    said = str(e).replace("\\n", " ").replace("\\'", "").strip("'\" ")
    name = next(
        (o for o in overrides if f"'{o.rsplit('.', 1)[-1]}'" in str(e)),
        overrides[-1] if overrides else "--config",
    )
    hint = re.search(r"Did you mean .*\?", said)
    message = f"{name}: no such config field" + (f" ({hint.group(0)})" if hint else "")
    message += "; the fields are in transformers_jax/train_config.py and config.py"
  except OSError:  # the config file cannot be read
    given = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
    if given is None and "--config" in argv[:-1]:
      given = argv[argv.index("--config") + 1]
    path = (given or "").split(":")[0]
    message = (
        f"--config: cannot load {path!r} (no such file, or it failed to import): give "
        "an experiment file, e.g. --config experiments/gpt2.py:cpu"
    )
  except flags.Error as e:
    message = _gist(str(e))
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def print_config_help() -> None:
  """--config_help: every field of --config (or of the defaults), then exit 0."""
  from transformers_jax import config_reference

  given = FLAGS["config"].value
  if given is None:
    print(config_reference.markdown())
  else:
    print(config_reference.help_text(given, FLAGS["config"].config_filename))
  sys.exit(0)


def run(main, start_backends: bool = True) -> None:
  app.run(user_errors(main, start_backends), flags_parser=parse_flags)


def parse_script_flags(flag_values: flags.FlagValues, argv, program: str) -> list[str]:
  """Parse a script's own flags (a FlagValues of its own, so that scripts imported side by side,
  as tests do, never clash) from `argv` (the arguments after the program name), every flag back
  at its default first. Returns the positional arguments. A bad flag is one error line (a
  UserError)."""
  flag_values.unparse_flags()
  try:
    return flag_values([program, *argv])[1:]
  except flags.Error as e:
    raise UserError(str(e).strip().splitlines()[0]) from None


def run_script(main) -> None:
  """`main(sys.argv[1:])` of a script with one error line and exit code 2 for a user's mistake;
  --help prints the script's docstring and flags."""
  if any(a in ("-h", "--help", "-help") for a in sys.argv[1:]):
    module = sys.modules[main.__module__]
    print((module.__doc__ or "").strip() + "\n")
    flag_values = getattr(module, "FLAGS", None)
    if isinstance(flag_values, flags.FlagValues):
      print(flag_values.main_module_help() or flag_values.get_help())
    return
  try:
    from transformers_jax import hardware

    hardware.start_backends()
    sys.exit(main(sys.argv[1:]) or 0)
  except (UserError, ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
