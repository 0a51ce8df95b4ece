"""A real text corpus bundled with every Python installation.

Documents are the standard library's own ``.py`` sources (test suites,
site-packages, codec tables in ``encodings``, build-specific and non-UTF-8
files excluded) and the topics of ``pydoc_data.topics``. They are sorted by
name and split into train/validation *by document* with a hash of the name, so
validation text is never seen in training. The same Python version always
gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import os
import pathlib
import platform
import sysconfig

from transformers_jax.data.errors import DataError

DEFAULT_MAX_BYTES = 4_000_000
DOC_SEPARATOR = "\n\n"
SPLITS = ("train", "validation")
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "__pycache__",
    "encodings",
}


def is_validation_name(name: str, val_fraction: float) -> bool:
  """Deterministic split: the first 8 bytes of sha256(name) as a fraction of 2**64."""
  digest = hashlib.sha256(name.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64 < val_fraction


def _skipped_dir(name: str) -> bool:
  return name in _SKIP_DIRS or name.startswith("config-")


def _stdlib_files() -> list[tuple[str, pathlib.Path]]:
  """Every `*.py` under the standard library's folder (what `rglob("*.py")` finds: symlinked
  folders are not entered) outside the skipped folders; the walk does not enter those at all,
  site-packages being most of the folder's size on many machines."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = []
  for folder, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if not _skipped_dir(d)]  # walked only if kept
    for name in (*dirnames, *filenames):
      if not fnmatch.fnmatchcase(name, "*.py"):
        continue
      path = pathlib.Path(folder, name)
      rel = path.relative_to(root)
      if rel.name.startswith("_sysconfigdata"):  # holds this machine's build paths
        continue
      files.append(("stdlib/" + rel.as_posix(), path))
  return files


def _pydoc_topics() -> dict[str, str]:
  try:
    from pydoc_data.topics import topics
  except ImportError:  # some minimal Python builds drop pydoc_data
    return {}
  return dict(topics)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Documents as ``(name, text)`` pairs, per split."""

  train_docs: tuple[tuple[str, str], ...]
  val_docs: tuple[tuple[str, str], ...]

  def docs(self, split: str) -> tuple[tuple[str, str], ...]:
    if split not in SPLITS:
      raise DataError(f"unknown corpus split {split!r}: use one of {SPLITS}")
    return self.train_docs if split == "train" else self.val_docs

  def text(self, split: str) -> str:
    """All documents of ``split`` joined with :data:`DOC_SEPARATOR`."""
    return DOC_SEPARATOR.join(text for _, text in self.docs(split))

  def stats(self) -> dict[str, object]:
    out: dict[str, object] = {"python_version": platform.python_version()}
    for split in SPLITS:
      docs = self.docs(split)
      out[f"{split}_files"] = len(docs)
      out[f"{split}_bytes"] = sum(len(t.encode("utf-8")) for _, t in docs)
    return out


@functools.lru_cache(maxsize=4)
def build_corpus(max_bytes: int = DEFAULT_MAX_BYTES, val_fraction: float = 0.05) -> Corpus:
  """Take documents in name order until the train split holds ``max_bytes`` UTF-8 bytes.

  Validation documents met on the way are kept, so validation is about
  ``val_fraction`` of the total. Cached: the result is immutable.
  """
  if max_bytes <= 0 or not 0.0 < val_fraction < 1.0:
    raise DataError(
        f"bad corpus size max_bytes={max_bytes}, val_fraction={val_fraction}: "
        "use max_bytes > 0 and 0 < val_fraction < 1"
    )
  topics = _pydoc_topics()
  sources: list[tuple[str, object]] = [("pydoc/" + k, v) for k, v in topics.items()]
  sources += _stdlib_files()
  sources.sort(key=lambda item: item[0])
  train, val, train_bytes = [], [], 0
  for name, source in sources:
    if isinstance(source, str):
      text = source
    else:
      try:
        text = source.read_bytes().decode("utf-8")
      except (OSError, UnicodeDecodeError):
        continue
    if not text.strip():
      continue
    if is_validation_name(name, val_fraction):
      val.append((name, text))
      continue
    train.append((name, text))
    train_bytes += len(text.encode("utf-8"))
    if train_bytes >= max_bytes:
      break
  if not train or not val:
    raise DataError(
        f"bundled corpus is too small ({len(train)} train / {len(val)} validation documents): "
        "raise max_bytes or pass your own text with --config.data.path"
    )
  return Corpus(tuple(train), tuple(val))
