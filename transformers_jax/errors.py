"""The project's error types, below everything that raises them: command lines print a
UserError as one `error:` line with exit code 2 (transformers_jax/cli.py)."""

from __future__ import annotations


class UserError(Exception):
  """A mistake in what the user asked for: printed as one line, exit code 2."""


class RunError(ValueError):
  """A run folder that cannot give what was asked (one line: the problem and the fix)."""
