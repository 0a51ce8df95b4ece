"""What every command line shares: the --config flag and one-line errors for a user's mistakes."""

from __future__ import annotations

import functools
import sys

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS


def define_config_flag(default: str | None = None) -> None:
  config_flags.DEFINE_config_file(
      "config", default,
      "Experiment config, e.g. experiments/gpt2.py:small; override fields with "
      "--config.model.num_layers=24 and the like.",
      lock_config=True)


class UserError(Exception):
  """A mistake in what the user asked for: printed as one line, exit code 2."""


def user_errors(main):
  """Wrap an absl main: ValueError / UserError / FileNotFoundError -> 'error: ...', exit 2."""

  @functools.wraps(main)
  def wrapped(argv):
    if not FLAGS["verbosity"].present:  # orbax logs every save at INFO; keep the console for us
      logging.set_verbosity(logging.WARNING)
    try:
      return main(argv)
    except (UserError, ValueError, FileNotFoundError) as e:  # DataError is a ValueError
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  return wrapped


def run(main) -> None:
  app.run(user_errors(main))
