"""The single exception type of the data package."""


class DataError(ValueError):
  """Bad data input: the message is one line naming the problem and the fix."""
