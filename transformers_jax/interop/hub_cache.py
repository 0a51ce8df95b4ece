"""Models named as the Hugging Face hub names them (`ORG/NAME`, `ORG/NAME@REVISION`), found in the
local Hugging Face cache with no network.

The cache is the folder `huggingface_hub` downloads into: $HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub. A model there is `models--ORG--NAME/` with `refs/<branch>` (the commit a
branch pointed at when it was downloaded), `snapshots/<commit>/` (the files, as links into
`blobs/`) and `blobs/`. `huggingface_hub` (which the `tokenizers` dependency installs) resolves
a name and revision there with `local_files_only=True`: it never opens a connection.

    folder = model_folder("Qwen/Qwen3-0.6B")            # .../snapshots/<commit>
    folder = model_folder("Qwen/Qwen3-0.6B@c1899de2")   # a commit, or a branch or tag name
"""

from __future__ import annotations

import pathlib
import re

from transformers_jax.interop.common import MissingCheckpointFile

# ORG/NAME with an optional @REVISION, as the hub spells repository ids (letters, digits, - _ .)
HUB_NAME = re.compile(
    r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?"
)


def is_hub_name(source) -> bool:
  """Whether `source` names a hub model (ORG/NAME[@REVISION]) rather than a local folder: it has
  that form and no such path exists here."""
  text = str(source)
  return bool(HUB_NAME.fullmatch(text)) and not pathlib.Path(text).exists()


def cache_folder() -> pathlib.Path:
  """The Hugging Face cache this process reads (huggingface_hub's own resolution of the
  environment variables)."""
  from huggingface_hub import constants

  return pathlib.Path(constants.HF_HUB_CACHE)


def model_folder(name: str, cache_dir=None) -> pathlib.Path:
  """The snapshot folder of hub model `name` (ORG/NAME[@REVISION]; default revision: main) in the
  Hugging Face cache (`cache_dir`, default: the environment's), read with no network. A name
  that is not cached is a MissingCheckpointFile saying where it looked and how to get it."""
  from huggingface_hub import snapshot_download
  from huggingface_hub.errors import LocalEntryNotFoundError

  found = HUB_NAME.fullmatch(name)
  if not found:
    raise MissingCheckpointFile(
        f"{name!r} is neither a folder nor a hub name ORG/NAME[@REVISION]: pass a model folder "
        "or a name such as Qwen/Qwen3-0.6B"
    )
  repo, revision = found["repo"], found["revision"] or "main"
  cache = pathlib.Path(cache_dir) if cache_dir else cache_folder()
  try:
    path = snapshot_download(repo, revision=revision, cache_dir=cache, local_files_only=True)
  except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    held = ""
    if repo_dir.is_dir():
      refs = (
          sorted(p.name for p in (repo_dir / "refs").glob("*"))
          if (repo_dir / "refs").is_dir()
          else []
      )
      snaps = sorted(p.name[:12] for p in (repo_dir / "snapshots").glob("*"))
      held = (
          f"; {repo_dir.name} holds revisions {', '.join(refs + snaps) or 'none'}, not "
          f"{revision!r}"
      )
    raise MissingCheckpointFile(
        f"{name} is no folder here and not in the Hugging Face cache (looked in {cache}{held}; "
        "set HF_HUB_CACHE "
        f"or HF_HOME to read another): download it where there is network with `hf download "
        f"{repo}" + (f" --revision {revision}" if found["revision"] else "") + "` (or "
        "huggingface_hub.snapshot_download) and copy the cache folder here, or pass the "
        "model's folder"
    ) from None
  return pathlib.Path(path)


def resolve(source) -> pathlib.Path:
  """A local folder as it is given; a hub name (is_hub_name) as its snapshot folder in the
  cache."""
  return model_folder(str(source)) if is_hub_name(source) else pathlib.Path(source)


__all__ = ["HUB_NAME", "cache_folder", "is_hub_name", "model_folder", "resolve"]
