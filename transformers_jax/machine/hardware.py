"""Accelerator data sheets: peak dense bf16 FLOP/s and memory per chip, matched against the
`device_kind` strings JAX reports, and TPU topologies to compile for without the hardware.

One table: MFU (train/metrics.py), `--compile_only` and scripts/plan_scale.py all read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str  # what people call it: "TPU v5p", "H100"
  device_kind: str  # what `jax.Device.device_kind` reports for it
  bf16_flops: float  # dense (no sparsity) bf16 peak FLOP/s per chip, from the data sheet
  hbm_gib: float  # memory per chip, from the data sheet
  topology_prefix: str = ""  # TPU generation as jax.experimental.topologies names it


# Most specific device_kind first: "TPU v5 lite" (v5e) must match before "TPU v5" (v5p).
CHIPS = (
    Chip("TPU v5e", "TPU v5 lite", 197e12, 16, "v5e"),
    Chip("TPU v6e", "TPU v6 lite", 918e12, 32, "v6e"),
    Chip("TPU v5p", "TPU v5", 459e12, 95, "v5p"),
    Chip("TPU v4", "TPU v4", 275e12, 32, "v4"),
    Chip("H200", "H200", 989e12, 141),
    Chip("H100", "H100", 989e12, 80),
    Chip("B200", "B200", 2250e12, 180),
    Chip("A100", "A100", 312e12, 80),
    Chip("V100", "V100", 125e12, 32),
)


def chip_for_kind(device_kind: str) -> Chip | None:
  """The data-sheet entry for a reported device_kind ("TPU v5 lite", "NVIDIA H100 80GB HBM3"),
  or None when the kind is not in the table."""
  kind = device_kind.lower()
  for chip in CHIPS:
    want = chip.device_kind.lower()
    if chip.topology_prefix:  # TPU kinds: exact, so "TPU v5" does not claim "TPU v5 lite"
      if kind == want:
        return chip
    elif want in kind:
      return chip
  return None


def chip_for_topology(topology: str) -> Chip:
  """The chip of a TPU topology name such as "v5p:4x4x4" or "v5e:2x2"."""
  prefix = topology.split(":")[0].lower()
  for chip in CHIPS:
    if chip.topology_prefix and chip.topology_prefix == prefix:
      return chip
  names = ", ".join(c.topology_prefix for c in CHIPS if c.topology_prefix)
  raise ValueError(
      f"mesh.topology={topology!r}: unknown TPU generation {prefix!r}; use one of "
      f"{names} with a shape, e.g. v5p:4x4x4 or v5e:2x2"
  )


def topology_devices(topology: str, num_slices: int = 1) -> list:
  """The devices of a TPU topology (`num_slices` slices of it, joined by DCN), from libtpu's
  compiler, on any host (no TPU needed)."""
  chip_for_topology(topology)
  if ":" not in topology:
    raise ValueError(
        f"mesh.topology={topology!r}: give the chip shape too, e.g. "
        f"{topology}:2x2 (v5e, v6e) or {topology}:4x4x4 (v4, v5p)"
    )
  _check_shape(topology)
  import importlib.util
  import os

  if importlib.util.find_spec("libtpu") is None:
    raise ValueError(
        f"mesh.topology={topology!r} needs the TPU compiler, libtpu: install it "
        "with pip install -e '.[tpu]' (no TPU needed)"
    )
  # Without it a second process compiling for a TPU (a test beside a script) finds libtpu's
  # lock taken and fails.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies

  try:
    with _stderr_quiet():  # libtpu warns that this host is no TPU VM, which we know
      desc = topologies.get_topology_desc(
          platform="tpu", topology_name=topology, num_slices=num_slices
      )
  except (RuntimeError, ValueError) as e:  # e.g. a shape the generation does not come in
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    text = re.sub(r"^[A-Z_]+: ", "", text)  # libtpu's status code
    raise ValueError(
        f"mesh.topology={topology!r}: libtpu does not build this slice ({text}): "
        f"{_shape_example(topology)}"
    ) from None
  return list(desc.devices)


# A slice's shape: chips along each of 2 or 3 axes (libtpu's "twisted" tori included).
_SHAPE = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}(_twisted|_untwisted)?")


def _shape_example(topology: str) -> str:
  chip = chip_for_topology(topology)
  name = chip.topology_prefix
  example = (
      f"{name}:4x4x4 or {name}:2x2x1" if name in ("v4", "v5p") else f"{name}:2x2 or {name}:4x8"
  )
  return (
      f"give {name}:AxB or {name}:AxBxC, the chips along each axis of a slice of {chip.name}, "
      f"e.g. {example}"
  )


def _check_shape(topology: str) -> None:
  """The chip shape after the colon: 2 or 3 positive integers joined by x, before libtpu sees
  it (libtpu's own words for 0x0 or 2x2x2x2 do not say what it wants)."""
  if not _SHAPE.fullmatch(topology.split(":", 1)[1]):
    raise ValueError(f"mesh.topology={topology!r}: {_shape_example(topology)}")


def start_backends() -> None:
  """Start JAX's backends. Where libtpu is installed (the `tpu` extra, to compile for TPU
  topologies) on a host without a TPU, libtpu prints warnings while JAX looks for one; they
  say nothing about the run, so there they are hidden."""
  import glob
  import importlib.util
  import jax

  tpu_here = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/*")
  if tpu_here or importlib.util.find_spec("libtpu") is None:
    jax.devices()
    return
  with _stderr_quiet():
    jax.devices()


@contextlib.contextmanager
def _stderr_quiet():
  """Send what native code writes to file descriptor 2 to /dev/null for the duration."""
  import os
  import sys

  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as null:
      os.dup2(null.fileno(), 2)
      yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def chips_of(devices) -> int:
  """Chips spanned by a list of devices (a chip with two cores may show as two devices)."""
  # a chip is its coordinates within its slice (every slice of a multi-slice has the same ones)
  if not all(getattr(d, "coords", None) for d in devices):
    return len(devices)
  coords = {(getattr(d, "slice_index", 0), *d.coords) for d in devices}
  return len(coords) if len(coords) > 1 else len(devices)


def quiet_cpu_host() -> None:
  """On a host with neither a TPU nor a GPU, run JAX on the CPU only (JAX_PLATFORMS=cpu, unless
  the user set it), decided before JAX starts its backends. Where libtpu is installed (the
  `tpu` and `test` extras, to compile for TPU topologies) JAX would otherwise load it to look
  for a TPU, and it complains on such a host: warnings about the TPU type and workers, "Failed
  to create TPU profiler ... UNIMPLEMENTED" when profiling, "sudo rm /tmp/libtpu_lockfile" when
  a second process looks too. Compiling for a TPU topology loads libtpu on its own and still
  works. Child processes inherit the setting."""
  import platform

  if os.environ.get("JAX_PLATFORMS") is not None or platform.system() != "Linux":
    return
  try:  # JAX's own probe: reads PCI ids from /sys, starts no backend
    from jax._src import hardware_utils

    accelerator = (
        hardware_utils.num_available_tpu_chips_and_device_id()[0]
        or hardware_utils.has_visible_nvidia_gpu()
        or hardware_utils.num_available_amd_gpus(stop_at=1)
    )
  except (ImportError, AttributeError, TypeError, OSError):  # another JAX: leave JAX's choice
    return
  if accelerator:
    return
  os.environ["JAX_PLATFORMS"] = "cpu"
  if "jax" in sys.modules:  # imported already: JAX read the variable then, so tell its config
    import jax

    jax.config.update("jax_platforms", "cpu")
