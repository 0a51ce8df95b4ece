"""safetensors files read and written one tensor at a time, so that a checkpoint larger than
memory's slack converts: `TensorFiles` reads a tensor only when it is taken (and drops the file's
mapping right after), `write_shards` writes shards of at most a given size with Hugging Face's
`model.safetensors.index.json` beside them."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping

import numpy as np

# what one shard holds at most when writing (transformers' save_pretrained default: 5 GB)
MAX_SHARD_BYTES = 5 * 10**9
INDEX = "model.safetensors.index.json"


class UnreadableFile(ValueError):
  """A safetensors file whose header or data cannot be read (message: the library's; a header
  that promises more data than the file holds is one); `path` names the file."""

  def __init__(self, path: pathlib.Path, error: Exception):
    super().__init__(str(error))
    self.path = path


def _open(path: pathlib.Path):
  from safetensors import safe_open

  try:
    return safe_open(str(path), framework="numpy")
  except Exception as e:  # safetensors raises its own SafetensorError (an Exception subclass)
    raise UnreadableFile(path, e) from None


class TensorFiles(MutableMapping):
  """name -> numpy array over safetensors files, each tensor read from its file when taken
  (`pop`, `[name]`): opening a file reads only its header, and each read opens, copies out one
  tensor and closes the file again, so no file stays mapped into memory. Names may be set to
  arrays in memory too (what a Family's adjust_loaded renames), or derived from other tensors
  when taken (`derive`: gpt-oss's MXFP4 experts). `shape(name)` never reads data."""

  def __init__(self, paths: list[pathlib.Path]):
    self._where: dict[str, pathlib.Path] = {}
    self._shapes: dict[str, tuple[int, ...]] = {}
    self._held: dict[str, np.ndarray] = {}
    self._source: dict[str, str] = {}  # a renamed tensor's name in its file
    self._derived: dict[str, tuple[tuple[int, ...], Callable[[], np.ndarray]]] = {}
    for path in paths:
      with _open(path) as f:
        for name in f.keys():
          self._where[name] = path
          self._shapes[name] = tuple(f.get_slice(name).get_shape())

  def renamed(self, rename: Callable[[str], str]) -> "TensorFiles":
    out = TensorFiles([])
    out._where = {rename(k): v for k, v in self._where.items()}
    out._shapes = {rename(k): v for k, v in self._shapes.items()}
    out._held = {rename(k): v for k, v in self._held.items()}
    out._source = {rename(k): self._source.get(k, k) for k in self._where}
    out._derived = {rename(k): v for k, v in self._derived.items()}
    return out

  def derive(self, name: str, sources: list[str], shape, make: Callable[..., np.ndarray]):
    """Replace the tensors `sources` by `name` of `shape`: make(*their arrays) when it is taken,
    each source read only then."""
    readers = [self._reader(s) for s in sources]
    for s in sources:
      del self[s]
    self._derived[name] = (tuple(shape), lambda: make(*(read() for read in readers)))

  def _reader(self, name: str) -> Callable[[], np.ndarray]:
    if name in self._held:
      return lambda held=self._held[name]: held
    path, source = self._where[name], self._source.get(name, name)

    def read():
      with _open(path) as f:
        try:
          return f.get_tensor(source)
        except Exception as e:  # safetensors' own SafetensorError
          raise UnreadableFile(path, e) from None

    return read

  def shape(self, name: str) -> tuple[int, ...]:
    if name in self._derived:
      return self._derived[name][0]
    return tuple(self._held[name].shape) if name in self._held else self._shapes[name]

  def __getitem__(self, name: str) -> np.ndarray:
    if name in self._derived:
      return self._derived[name][1]()
    if name in self._held:
      return self._held[name]
    path = self._where[name]
    with _open(path) as f:
      try:
        return f.get_tensor(self._source.get(name, name))
      except Exception as e:  # safetensors' own SafetensorError
        raise UnreadableFile(path, e) from None

  def __setitem__(self, name: str, value: np.ndarray) -> None:
    self._where.pop(name, None)
    self._held[name] = value

  def __delitem__(self, name: str) -> None:
    if name in self._derived:
      del self._derived[name]
    elif name in self._held:
      del self._held[name]
    else:
      del self._where[name]

  def __iter__(self) -> Iterator[str]:
    yield from self._derived
    yield from self._held
    yield from (k for k in self._where if k not in self._held)

  def __len__(self) -> int:
    held = len(self._held) + sum(1 for k in self._where if k not in self._held)
    return len(self._derived) + held

  def __contains__(self, name) -> bool:
    return name in self._derived or name in self._held or name in self._where


class LazyArrays(MutableMapping):
  """name -> array, each made by its function only when taken (and not kept), its shape and
  dtype known before: what a checkpoint about to be written holds. Arrays may be set too."""

  def __init__(self):
    self._made: dict[str, tuple[tuple[int, ...], np.dtype, Callable[[], np.ndarray]]] = {}
    self._held: dict[str, np.ndarray] = {}

  def plan(self, name: str, shape, dtype, make: Callable[[], np.ndarray]) -> None:
    self._made[name] = (tuple(shape), np.dtype(dtype), make)

  def spec(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of `name`, without making it."""
    if name in self._held:
      return self._held[name].shape, self._held[name].dtype
    return self._made[name][:2]

  def __getitem__(self, name: str) -> np.ndarray:
    return self._held[name] if name in self._held else self._made[name][2]()

  def __setitem__(self, name: str, value: np.ndarray) -> None:
    self._made.pop(name, None)
    self._held[name] = value

  def __delitem__(self, name: str) -> None:
    if name in self._held:
      del self._held[name]
    else:
      del self._made[name]

  def __iter__(self) -> Iterator[str]:
    yield from self._made
    yield from (k for k in self._held if k not in self._made)

  def __len__(self) -> int:
    return len(self._made) + sum(1 for k in self._held if k not in self._made)


def plan_shards(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
  """Names grouped in order into shards of at most `max_bytes` (a larger tensor alone)."""
  shards: list[list[str]] = [[]]
  used = 0
  for name, size in sizes.items():
    if shards[-1] and used + size > max_bytes:
      shards.append([])
      used = 0
    shards[-1].append(name)
    used += size
  return shards


def write_shards(
    directory: pathlib.Path,
    names: list[str],
    spec: Callable[[str], tuple[tuple[int, ...], np.dtype]],
    tensor: Callable[[str], np.ndarray],
    single: str,
    max_bytes: int = MAX_SHARD_BYTES,
) -> list[str]:
  """Write tensors `names` (their shapes and dtypes given by `spec` beforehand; each made by
  `tensor(name)` only when it is written, and dropped after) as `single` when they fit one
  shard, else as model-0000i-of-0000n.safetensors with the index. Returns the file names."""
  sizes = {n: nbytes_of(*spec(n)) for n in names}
  shards = plan_shards(sizes, max_bytes)
  if len(shards) == 1:
    files = [single]
  else:
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  weight_map = {}
  for file, shard in zip(files, shards):
    write_safetensors(directory / file, shard, spec, tensor)
    weight_map.update({n: file for n in shard})
  if len(files) > 1:
    total = sum(sizes.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")
  return files


# safetensors' names of the dtypes a checkpoint here holds
SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64"}


def write_safetensors(path: pathlib.Path, names, spec, tensor) -> None:
  """One safetensors file of `names`, written one tensor at a time: the header (each tensor's
  dtype, shape and byte range, from `spec`) first, then each `tensor(name)` as it is made, so
  that no more than one tensor is in memory. Written under a temporary name and renamed when
  complete (safetensors.numpy.save_file needs every tensor in memory at once). safetensors
  reads it back."""
  header, offset = {"__metadata__": {"format": "pt"}}, 0
  for name in names:
    shape, dtype = spec(name)
    end = offset + nbytes_of(shape, dtype)
    kind = SAFETENSORS_DTYPES[np.dtype(dtype).name]
    header[name] = {"dtype": kind, "shape": list(shape), "data_offsets": [offset, end]}
    offset = end
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors pads
  partial = path.with_name(path.name + ".partial")
  try:
    with open(partial, "wb") as f:
      f.write(len(encoded).to_bytes(8, "little") + encoded)
      for name in names:
        array = np.ascontiguousarray(tensor(name))
        made = {"dtype": SAFETENSORS_DTYPES.get(array.dtype.name), "shape": list(array.shape)}
        if made != {key: header[name][key] for key in made}:
          raise ValueError(f"{name}: made {made}, the header says {header[name]}")
        f.write(array.view(np.uint8).data)
        del array
    partial.replace(path)
  finally:
    partial.unlink(missing_ok=True)  # a write that failed leaves no file behind


def nbytes_of(shape: tuple[int, ...], dtype) -> int:
  return math.prod(shape) * np.dtype(dtype).itemsize
