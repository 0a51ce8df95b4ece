"""Per-layer attention in config.json <-> model.layer_types (modules/layer_types.py): the
`layer_types` list (full_attention, sliding_attention, chunked_attention per layer), the layers
that leave out RoPE (SmolLM3's `no_rope_layers`), and RoPE settings per layer type (Gemma 3's
and OLMo 3's `rope_parameters` keyed by layer type)."""

from __future__ import annotations

from collections.abc import Mapping

from transformers_jax.interop.common import UnsupportedArchitecture, UnsupportedConfig
from transformers_jax.interop.llama import rope_parameters, rope_values
from transformers_jax.modules import layer_types
from transformers_jax.modules.layer_types import LAYER_TYPES

HF_KINDS = {
    "full": "full_attention",
    "sliding": "sliding_attention",
    "chunked": "chunked_attention",
}
OURS = {(t.attention, t.rope != "none"): name for name, t in LAYER_TYPES.items()}


def hf_layer_types(c) -> list[str]:
  """config.json's layer_types: each block's attention."""
  return [HF_KINDS[LAYER_TYPES[n].attention] for n in layer_types.names(c, c.num_layers)]


def rotary_layers(c) -> list[int]:
  """1 for each block that applies RoPE, 0 for a NoPE block (SmolLM3's no_rope_layers)."""
  return [int(LAYER_TYPES[n].rope != "none") for n in layer_types.names(c, c.num_layers)]


def read_layer_types(hf: Mapping, where: str, window, rotary=None) -> str:
  """model.layer_types of config.json's per-layer lists ("" when every layer attends fully with
  RoPE); sliding layers attend fully where the config gives no `window`."""
  layers = hf["num_hidden_layers"]
  kinds = hf.get("layer_types") or ["full_attention"] * layers
  rotary = [1] * layers if rotary is None else list(rotary)
  for key, values in (("layer_types", kinds), ("no_rope_layers", rotary)):
    if not isinstance(values, list) or len(values) != layers:
      raise UnsupportedArchitecture(
          f"{where}: {key} lists {len(values) if isinstance(values, list) else values!r} "
          f"layers, but num_hidden_layers={layers}: use the config.json saved with the weights"
      )
  attention = {v: k for k, v in HF_KINDS.items()}
  names = []
  for kind, rope in zip(kinds, rotary):
    if kind not in attention:
      raise UnsupportedArchitecture(
          f"{where}: layer_types holds {kind!r}, which is not supported (only "
          f"{', '.join(HF_KINDS.values())})"
      )
    ours = attention[kind] if (kind != "sliding_attention" or window) else "full"
    if (ours, bool(rope)) not in OURS:
      raise UnsupportedArchitecture(
          f"{where}: a {kind} layer without RoPE is not supported: use a checkpoint whose "
          "chunked layers rotate"
      )
    names.append(OURS[(ours, bool(rope))])
  text = layer_types.compress(names)
  return "" if text == "full" else text


def check_layer_kinds(c, architecture: str, allowed: tuple[str, ...]) -> None:
  """Refuse layer types (model.layer_types) that `architecture` cannot express."""
  found = sorted(set(layer_types.names(c, c.num_layers)) - set(allowed))
  if found:
    raise UnsupportedConfig(
        f"cannot write model.layer_types={c.layer_types!r} as {architecture}, whose layers are "
        f"{' or '.join(allowed)} (not {found[0]}): change the config or pick another architecture"
    )


def read_typed_rope(hf: Mapping, where: str, theta: float, local_theta: float):
  """(rope_theta, rope_scaling, rope_local_theta) from rope_parameters keyed by layer type
  (transformers 5), or the hub's rope_theta / rope_scaling / rope_local_base_freq (`theta` and
  `local_theta`: what the config class takes where a key is missing). rope_local_theta is 0
  where the sliding layers rotate as the full ones do."""
  params = hf.get("rope_parameters") or {}
  if "full_attention" in params or "sliding_attention" in params:
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
  else:
    full = dict(hf.get("rope_scaling") or params or {})
    full.setdefault("rope_theta", hf.get("rope_theta", theta))
    local = {"rope_theta": hf.get("rope_local_base_freq", local_theta)}
  full_theta, scaling = rope_values(full, theta, where)
  local_theta, local_scaling = rope_values(local, local_theta, where, "sliding layers' RoPE")
  if local_scaling:
    raise UnsupportedArchitecture(
        f"{where}: the sliding layers' RoPE scaling {local_scaling.split(':')[0]!r} is not "
        "supported (their rotation is plain RoPE at rope_local_theta): use a checkpoint without it"
    )
  same = local_theta == full_theta and not scaling
  return full_theta, scaling, 0.0 if same else local_theta


def typed_rope_parameters(c) -> dict:
  """config.json's rope_parameters keyed by layer type."""
  local = c.rope_local_theta or c.rope_theta
  scaling = "" if c.rope_local_theta else c.rope_scaling
  return {
      "full_attention": rope_parameters(c.rope_theta, c.rope_scaling),
      "sliding_attention": rope_parameters(local, scaling),
  }
